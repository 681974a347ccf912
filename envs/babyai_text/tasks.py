"""Task identity: which task type and minigrid seed a (split, seed) pair names.

Splits:
- `train` and `eval`: the same level, disjoint minigrid seeds (even for train, odd for eval).
  The task type is drawn per task from a RNG seeded by (split, seed): `uniform` draws each
  task independently; `balanced` deals every block of len(task_types) consecutive seeds one
  task of each type, in a seeded random order.
- `eval50`: the study's 50-task evaluation set (EVAL50_COUNTS), seeds 0..49, task types
  interleaved so that any prefix mixes them, drawn from the eval seed stream in a region
  that the `eval` split never reaches.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

TASK_TYPES: tuple[str, ...] = (
    "go_to",
    "pick_up",
    "put_next_to",
    "pick_up_then_go_to",
    "go_to_after_pick_up",
    "open",
)

EVAL50_COUNTS: dict[str, int] = {
    "go_to": 5,
    "go_to_after_pick_up": 9,
    "open": 11,
    "pick_up": 11,
    "pick_up_then_go_to": 6,
    "put_next_to": 8,
}

SPLITS: tuple[str, ...] = ("train", "eval", "eval50")
MAX_SEED = 10**9
"""Seeds of `train` and `eval` lie in [0, MAX_SEED); eval50 lives above that region."""

TaskSampling = Literal["uniform", "balanced"]



def _interleave(counts: dict[str, int]) -> tuple[str, ...]:
    """Round-robin over task types, so any prefix of the split mixes them."""
    remaining = dict(counts)
    order: list[str] = []
    while any(remaining.values()):
        for task_type in counts:
            if remaining[task_type]:
                order.append(task_type)
                remaining[task_type] -= 1
    return tuple(order)


_EVAL50_TYPES = _interleave(EVAL50_COUNTS)


@dataclass(frozen=True)
class TaskSpec:
    """The task a (split, seed) pair names."""

    task_type: str
    """One of TASK_TYPES."""
    level_seed: int
    """Seed passed to minigrid's reset."""


def split_size(split: str) -> int | None:
    """Number of tasks in a split, or None when it is unbounded (below MAX_SEED)."""
    check_split(split)
    return len(_EVAL50_TYPES) if split == "eval50" else None


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known splits: {list(SPLITS)}")


def task_spec(split: str, seed: int, task_types: tuple[str, ...] = TASK_TYPES,
              sampling: TaskSampling = "uniform") -> TaskSpec:
    """Resolve (split, seed) to a task type and minigrid seed; deterministic."""
    check_split(split)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if split == "eval50":
        if not 0 <= seed < len(_EVAL50_TYPES):
            raise ValueError(f"eval50 has seeds 0..{len(_EVAL50_TYPES) - 1}, got {seed}")
        return TaskSpec(_EVAL50_TYPES[seed], 2 * (MAX_SEED + seed) + 1)
    if not 0 <= seed < MAX_SEED:
        raise ValueError(f"seed must be in [0, {MAX_SEED}), got {seed}")
    stream = 0 if split == "train" else 1
    if sampling == "uniform":
        task_type = random.Random(f"{split}:{seed}").choice(task_types)
    elif sampling == "balanced":
        block = random.Random(f"{split}:block:{seed // len(task_types)}").sample(task_types, len(task_types))
        task_type = block[seed % len(task_types)]
    else:
        raise ValueError(f"task sampling must be 'uniform' or 'balanced', got {sampling!r}")
    return TaskSpec(task_type, 2 * seed + stream)
