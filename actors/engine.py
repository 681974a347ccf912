"""The `InferenceEngine` seam and its sampling settings.

Token-in, token-out: engines take prompt token ids and return the sampled token ids with
the log-prob of each under the distribution that actually sampled it (after temperature
and top-p), so the learner's importance ratios use the true behaviour policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field


class SamplingConfig(BaseModel):
    """How responses are sampled."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(default=1.0, ge=0.0)
    """0 means greedy decoding."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(default=64, ge=1)
    seed: int | None = None
    """Seeds sampling for reproducible rollouts; None leaves the RNG alone."""


@dataclass(frozen=True)
class Generation:
    """One sampled response."""

    token_ids: tuple[int, ...]
    """Response token ids, shape [num_tokens], including the stop token when one was hit."""
    logprobs: tuple[float, ...]
    """Log-prob of each response token under the sampling distribution, shape [num_tokens]."""
    finish_reason: Literal["stop", "length"]
    """'stop' when a stop token ended the response, 'length' when max_new_tokens did."""


@dataclass(frozen=True)
class PublishedWeights:
    """A full state dict as the learner puts it into the object store, once per publish.

    numpy arrays, which Ray stores out of band and every worker maps zero-copy. numpy has no
    bfloat16, so a bf16 tensor travels as its 16-bit pattern (an int16 view of the same bytes)
    and `dtypes` names it: bf16 weights cross the object store at 2 bytes a parameter, with no
    float32 round trip.
    """

    arrays: dict
    """HF parameter name -> numpy array of the tensor's bytes (same shape)."""
    dtypes: dict
    """HF parameter name -> torch dtype name ('bfloat16'), for tensors numpy cannot represent."""

    @classmethod
    def from_state_dict(cls, state: dict) -> "PublishedWeights":
        import torch

        arrays, dtypes = {}, {}
        for name, tensor in state.items():
            tensor = tensor.detach().contiguous().cpu()
            if tensor.dtype == torch.bfloat16:
                arrays[name], dtypes[name] = tensor.view(torch.int16).numpy(), "bfloat16"
            else:
                arrays[name] = tensor.numpy()
        return cls(arrays, dtypes)


def weights_as_tensors(state) -> dict:
    """Published weights (`PublishedWeights`, or a state dict of numpy arrays or tensors) as tensors.

    The arrays are read-only views; loading copies them into the engine's parameters, which
    is the only thing done with them.
    """
    import warnings

    import numpy as np
    import torch

    dtypes = {}
    if isinstance(state, PublishedWeights):
        state, dtypes = state.arrays, state.dtypes
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tensors = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in state.items()}
    return {k: v.view(getattr(torch, dtypes[k])) if k in dtypes else v for k, v in tensors.items()}


class InferenceEngine(Protocol):
    """Batched generation from token ids; weights can be swapped by version."""

    @property
    def version(self) -> int:
        """Policy version of the weights currently loaded."""
        ...

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig) -> list[Generation]:
        """One response per prompt, in order."""
        ...

    def update_weights(self, state_dict: dict, version: int) -> None:
        """Replace the weights (full state dict, HF parameter names); tag later generations `version`."""
        ...

    def close(self) -> None:
        """Release the engine's processes and caches; it is not used again."""
        ...
