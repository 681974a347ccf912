"""Teacher-logprob service: backends (HF, vLLM prompt log-probs, BabyAI oracle), privileged context."""
