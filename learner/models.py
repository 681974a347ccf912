"""Model and tokenizer loading: tiny factory models or a local HF directory.

`path` is either `tiny:<preset>` (built offline by learner.tiny into the cache) or a local
directory saved with `save_pretrained`. Nothing is fetched from a hub: loads use
`local_files_only=True`, so a hub name fails with a clear message instead of a network call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from learner.tiny import PRESETS, tiny_model_dir

TINY_PREFIX = "tiny:"


class ModelConfig(BaseModel):
    """Which model to load, and how."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = "tiny:tiny"
    """'tiny:<preset>' (nano, tiny, small) or a local HF model directory."""
    seed: int = Field(default=0, ge=0)
    """Initialisation seed of a tiny model (ignored for a directory)."""
    cache_dir: str | None = None
    """Where tiny models are built; default $APPRENTICE_CACHE or ~/.cache/apprentice."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


def resolve_model_dir(config: ModelConfig) -> Path:
    """The directory holding the model, building a tiny model on first use."""
    if config.path.startswith(TINY_PREFIX):
        preset = config.path[len(TINY_PREFIX):]
        if preset not in PRESETS:
            raise ValueError(f"model.path {config.path!r}: unknown tiny preset; known: "
                             f"{[TINY_PREFIX + p for p in sorted(PRESETS)]}")
        return tiny_model_dir(preset, config.seed, config.cache_dir)
    directory = Path(config.path).expanduser()
    if not (directory / "config.json").is_file():
        raise ValueError(f"model.path {config.path!r} is not a local model directory (no config.json); "
                         f"use 'tiny:<preset>' or a directory saved with save_pretrained")
    return directory


def load_tokenizer(config: ModelConfig):
    """The model's tokenizer; it must carry a chat template (tool calls are rendered with it)."""
    from transformers import AutoTokenizer

    directory = resolve_model_dir(config)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    if not tokenizer.chat_template:
        raise ValueError(f"the tokenizer in {directory} has no chat template; Apprentice renders "
                         f"turns with the model's own template")
    return tokenizer


def load_model(config: ModelConfig, device: str = "cpu"):
    """The causal LM in eval mode on `device`."""
    import torch
    from transformers import AutoModelForCausalLM

    directory = resolve_model_dir(config)
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True,
                                                 dtype=getattr(torch, config.dtype))
    return model.to(device).eval()
