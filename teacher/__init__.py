"""Teacher-logprob service: backends (HF, vLLM prompt log-probs, the environment's expert as oracle), privileged context."""
