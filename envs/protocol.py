"""The `TextEnv` seam: every text environment (BabyAI-Text, ALFWorld) implements this.

An environment is driven by tool calls and answers with text. It is deterministic for a
(split, seed) pair, so a trajectory can always be replayed from its task id and actions
(the oracle teacher and TCOD-B2F rely on this).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call."""

    name: str
    """Tool name, one of the environment's tool schemas."""
    arguments: dict[str, Any] = field(default_factory=dict)
    """JSON arguments, already validated against the tool's parameter schema."""


@dataclass(frozen=True)
class TaskInfo:
    """Identity of one task instance."""

    split: str
    """Named split the task came from (e.g. 'train', 'eval', 'eval50')."""
    seed: int
    """Index of the task inside its split; (split, seed) always gives the same task."""
    task_type: str
    """Task family, e.g. 'go_to' or 'put_next_to'."""
    max_steps: int
    """Environment step limit for this task (the LLM-level turn limit is separate)."""


@dataclass(frozen=True)
class EnvReset:
    """What the agent sees when an episode starts."""

    task: str
    """The instruction, e.g. 'go to the red ball'."""
    observation: str
    """First observation text, one sentence per line."""
    info: TaskInfo
    """Identity of the task."""


@dataclass(frozen=True)
class EnvStep:
    """The environment's answer to one tool call."""

    observation: str
    """Observation text after the call (the tool response), one sentence per line."""
    done: bool
    """True when the episode ended: success, failure or the environment's step limit."""
    success: bool
    """True only when the environment's own verifier reports success."""
    num_steps: int
    """Environment steps taken so far in this episode."""
    truncated: bool = False
    """True when the episode ended because the step limit was reached."""


@runtime_checkable
class TextEnv(Protocol):
    """A multi-turn text environment driven by tool calls."""

    @property
    def tools(self) -> list[dict[str, Any]]:
        """Tool schemas in the OpenAI/HF `tools` format."""
        ...

    def reset(self, seed: int, split: str) -> EnvReset:
        """Start the task (split, seed); deterministic."""
        ...

    def step(self, call: ToolCall) -> EnvStep:
        """Apply one validated tool call."""
        ...
