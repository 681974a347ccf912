"""The `InferenceEngine` seam and its sampling settings.

Token-in, token-out: engines take prompt token ids and return the sampled token ids with
the log-prob of each under the distribution that actually sampled it (after temperature
and top-p), so the learner's importance ratios use the true behaviour policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, Protocol

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


Request = tuple[Any, list[int], SamplingConfig]
"""(the caller's key, prompt token ids, sampling) of one generation."""


def stream_generations(engine: InferenceEngine, admit: Callable[[], list[Request]]
                       ) -> Iterator[tuple[Any, Generation]]:
    """(key, generation) of every request `admit()` gives, until it gives none and none is in
    flight. An engine with continuous batching (a `stream` method, as `VLLMEngine`'s) adds each
    request to the running batch; any other engine answers them in rounds of `generate`, asking
    `admit()` again after each round."""
    stream = getattr(engine, "stream", None)
    if stream is not None:
        yield from stream(admit)
        return
    while requests := admit():
        rounds: dict[SamplingConfig, list[Request]] = {}
        for request in requests:
            rounds.setdefault(request[2], []).append(request)
        for sampling, batch in rounds.items():
            yield from zip([key for key, _, _ in batch], engine.generate([p for _, p, _ in batch], sampling))
