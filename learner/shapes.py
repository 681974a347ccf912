"""Qwen3 model shapes without weights: randomly initialised models for throughput and memory
benchmarks at the sizes users train (the GPU benchmarks), plus their FLOPs per token.

The published Qwen3 configs (hidden size, MLP width, layers, query/KV heads, head dim, vocab,
tied embeddings) are restated here so a machine without the checkpoints can build the same
architecture; `tiny` is the embedded default's student.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from models.tiny import PRESETS, TinyPreset


@dataclass(frozen=True)
class Shape(TinyPreset):
    """A Qwen3 architecture's sizes (the tiny presets' fields, plus tied embeddings)."""

    tie_word_embeddings: bool = False

    def matmul_params(self) -> int:
        """Weights that multiply every token (projections, MLP, LM head); embeddings lookups and
        norms excluded."""
        d, q, kv = self.hidden_size, self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        per_layer = d * q + 2 * d * kv + q * d + 3 * d * self.intermediate_size
        return self.num_hidden_layers * per_layer + self.vocab_size * d

    def train_flops(self, sequence_lengths: list[int]) -> float:
        """Model FLOPs of one forward+backward over these sequences: 6 per matmul weight per token,
        plus causal attention (QK^T and AV: 2 x 2 x context x query width per token forward, x3 with
        backward; a token at position t attends to t+1 tokens). Recomputation is not counted (MFU
        counts the model's work, not the hardware's)."""
        tokens = sum(sequence_lengths)
        context = sum(n * (n + 1) / 2 for n in sequence_lengths)
        q = self.num_attention_heads * self.head_dim
        return 6 * self.matmul_params() * tokens + 12 * self.num_hidden_layers * q * context


SHAPES: dict[str, Shape] = {
    "tiny": Shape(**asdict(PRESETS["tiny"])),
    "qwen3-0.6b": Shape(151936, 1024, 3072, 28, 16, 8, 128, 40960, tie_word_embeddings=True),
    "qwen3-1.7b": Shape(151936, 2048, 6144, 28, 16, 8, 128, 40960, tie_word_embeddings=True),
    "qwen3-4b": Shape(151936, 2560, 9728, 36, 32, 8, 128, 40960, tie_word_embeddings=True),
}


def random_model(shape: str, dtype: str = "float32", device: str = "cpu", seed: int = 0,
                 num_hidden_layers: int | None = None):
    """A randomly initialised Qwen3 causal LM of the named shape (no download, no weights);
    `num_hidden_layers` cuts it to fewer blocks of the same width and vocabulary."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {sorted(SHAPES)}")
    s = SHAPES[shape]
    config = Qwen3Config(vocab_size=s.vocab_size, hidden_size=s.hidden_size,
                         intermediate_size=s.intermediate_size, num_hidden_layers=num_hidden_layers or s.num_hidden_layers,
                         num_attention_heads=s.num_attention_heads, num_key_value_heads=s.num_key_value_heads,
                         head_dim=s.head_dim, tie_word_embeddings=s.tie_word_embeddings,
                         max_position_embeddings=s.max_position_embeddings, rope_theta=1_000_000.0, pad_token_id=0,
                         use_cache=False)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config)
    return model.to(getattr(torch, dtype)).eval()
