"""Model and tokenizer loading: tiny factory models, a local HF directory, or a Hugging Face Hub name.

`path` is `tiny:<preset>` (built offline by models.tiny into the cache), a local directory
saved with `save_pretrained`, or a Hub repository id (`Qwen/Qwen3-1.7B`). A Hub model is
downloaded once, where the job starts (`fetch_model`, from the driver's preflight), into the
Hugging Face cache ($HF_HOME / $HF_HUB_CACHE); every actor then reads it from that cache without
a network call (`local_files_only`), so on a multi-node cluster the cache must be on storage
every node mounts (README, "Multi-node"). Offline ($HF_HUB_OFFLINE=1) and not in the cache, the
name is refused with the cache it looked in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from models.tiny import PRESETS, tiny_model_dir

TINY_PREFIX = "tiny:"


class ModelConfig(BaseModel):
    """Which model to load, and how."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = "tiny:tiny"
    """'tiny:<preset>' (nano, nano384, tiny, tiny384, small), a local HF model directory, or a Hub name (Qwen/Qwen3-1.7B)."""
    seed: int = Field(default=0, ge=0)
    """Initialisation seed of a tiny model (ignored for a directory)."""
    cache_dir: str | None = None
    """Where tiny models are built; default $APPRENTICE_CACHE or ~/.cache/apprentice."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]
"""What a load needs of a Hub repository (weights as safetensors, config, tokenizer, template)."""


def _is_hub_name(path: str) -> bool:
    """`org/name` that is no local path: the form of a Hub repository id."""
    parts = path.split("/")
    return len(parts) == 2 and all(parts) and not path.startswith((".", "~")) and not Path(path).exists()


def _hub_snapshot(path: str, download: bool) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.constants import HF_HUB_CACHE, HF_HUB_OFFLINE
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(path, allow_patterns=HUB_FILES, local_files_only=not download or HF_HUB_OFFLINE))
    except LocalEntryNotFoundError:
        why = "offline ($HF_HUB_OFFLINE=1)" if HF_HUB_OFFLINE else \
            "the job's driver downloads it before any actor starts; on a multi-node cluster $HF_HOME must be shared"
        raise ValueError(f"model.path {path!r}: not in the Hugging Face cache {HF_HUB_CACHE} ({why})") from None


def resolve_model_dir(config: ModelConfig) -> Path:
    """The directory holding the model: a tiny model is built on first use; a Hub name is read
    from the Hugging Face cache (never downloaded here: `fetch_model`)."""
    if config.path.startswith(TINY_PREFIX):
        preset = config.path[len(TINY_PREFIX):]
        if preset not in PRESETS:
            raise ValueError(f"model.path {config.path!r}: unknown tiny preset; known: "
                             f"{[TINY_PREFIX + p for p in sorted(PRESETS)]}")
        return tiny_model_dir(preset, config.seed, config.cache_dir)
    if _is_hub_name(config.path):
        return _hub_snapshot(config.path, download=False)
    directory = Path(config.path).expanduser()
    if not (directory / "config.json").is_file():
        raise ValueError(f"model.path {config.path!r} is not a local model directory (no config.json); "
                         f"use 'tiny:<preset>', a directory saved with save_pretrained or a Hub name (Qwen/Qwen3-1.7B)")
    return directory


def fetch_model(config: ModelConfig) -> Path:
    """`resolve_model_dir`, downloading a Hub model into the cache first when it is absent and
    the machine is online: called once, where the job starts."""
    if _is_hub_name(config.path):
        return _hub_snapshot(config.path, download=True)
    return resolve_model_dir(config)


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
