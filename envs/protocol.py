"""The `TextEnv` seam: every text environment (BabyAI-Text, ALFWorld, ScienceWorld) implements this.

An environment is driven by tool calls and answers with text. It is deterministic for a
(split, seed) pair, so a trajectory can always be replayed from its task id and actions
(the oracle teacher and TCOD-B2F rely on this). ScienceWorld comes close (docs/scienceworld.md):
the order of a listing, the expert's choice among equivalent objects and an electrical circuit's
completion (one step apart) can differ between two of its processes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call."""

    name: str
    """Tool name, one of the environment's tool schemas."""
    arguments: dict[str, Any] = field(default_factory=dict)
    """JSON arguments, already validated against the tool's parameter schema."""

    @classmethod
    def from_json(cls, text: str) -> "ToolCall":
        """From a recorded `Turn.executed_call` ({"name", "arguments"} as JSON)."""
        raw = json.loads(text)
        return cls(raw["name"], raw["arguments"])


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
    score: float | None = None
    """Partial credit in [0, 1] from an environment that grades progress (ScienceWorld's 0-100
    score / 100); None where only success counts. The outcome reward interpolates with it
    (envs.rewards.episode_reward)."""


class EnvCrashed(RuntimeError):
    """The process running an environment died (actors.env_actor); its episode must start over."""


class Expert(Protocol):
    """A scripted policy for the current episode of one environment (demonstrations, the oracle
    teacher, baselines). It can advise an agent that does not follow it: it is told every call
    that was actually executed."""

    def act(self, executed: ToolCall | None) -> ToolCall | None:
        """The call it would make next, given the call executed since its last answer (None on
        the first turn); None when it has no plan (it thinks the task is done, or cannot finish it)."""
        ...


@runtime_checkable
class TextEnv(Protocol):
    """A multi-turn text environment driven by tool calls; registered in `envs.registry`."""

    system_prompt: str
    """The system turn's text (before the tool list), shared by the student and the teacher."""
    splits: tuple[str, ...]
    """Task splits `reset` accepts."""

    @property
    def task_types(self) -> tuple[str, ...]:
        """The task families its tasks are drawn from (`TaskInfo.task_type`; teacher routes name them)."""
        ...

    @property
    def tools(self) -> list[dict[str, Any]]:
        """Tool schemas in the OpenAI/HF `tools` format."""
        ...

    def split_size(self, split: str) -> int | None:
        """Number of tasks (seeds 0..n-1) in a split, None when it is unbounded; ValueError for an unknown split."""
        ...

    def reset(self, seed: int, split: str) -> EnvReset:
        """Start the task (split, seed); deterministic."""
        ...

    def step(self, call: ToolCall) -> EnvStep:
        """Apply one validated tool call."""
        ...

    def expert(self) -> Expert | None:
        """A fresh expert for the episode just reset, or None when the environment has none."""
        ...

    def recover(self, text: str) -> ToolCall | None:
        """Gentle format: the call an unparsable response most likely meant, from its text and the
        episode's state (ALFWorld: the admissible command it names last), or None. Asked only
        when the parser's own fallback (an argument-free tool named in the tail) found nothing;
        the turn stays a format error either way."""
        ...
