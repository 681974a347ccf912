"""TCOD's horizon curriculum (docs/algorithms.md §4): how many turns the student plays.

The horizon `k = k_start + ⌊n / η⌋` grows with n, the main-loop learner version of the
weights that start the episode (the version after the warm start; workers read it from the
weights they run, never from a counter of their own). Per episode:

- F2B (front to back): the student acts for at most k turns from the start.
- B2F (back to front): the first `L − k` turns of an expert's successful trajectory τ*
  (length L) for the same (split, seed) are replayed -- in the prompt as if played, but
  untrainable -- and the student continues from there; once k ≥ L it plays the whole task.
  A task without an expert success is played by the student alone (counted by the caller).

Pure functions; the rollout worker applies the plan, `jobs.collect_expert` writes τ*.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from envs.protocol import ToolCall


class TCODConfig(BaseModel):
    """The horizon curriculum of the `tcod` algorithm."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["f2b", "b2f"] = "f2b"
    k_start: int = Field(default=1, ge=1)
    eta: int = Field(default=2, ge=1)
    """Learner versions per horizon step."""
    expert_path: str | None = None
    """B2F: the directory `jobs.collect_expert` wrote (expert.parquet + manifest.json)."""

    @model_validator(mode="after")
    def _b2f_needs_experts(self) -> "TCODConfig":
        if self.mode == "b2f" and self.expert_path is None:
            raise ValueError("mode=b2f needs expert_path (write it with python -m jobs.collect_expert)")
        return self


def horizon(config: TCODConfig, step: int) -> int:
    """k at main-loop version `step` (0 right after the warm start)."""
    if step < 0:
        raise ValueError(f"the horizon needs a main-loop version >= 0, got {step}")
    return config.k_start + step // config.eta


@dataclass(frozen=True)
class EpisodePlan:
    """How one episode runs under the curriculum."""

    horizon_k: int
    """k in force."""
    max_turns: int
    """Turn limit of the episode, replayed turns included."""
    replay: tuple[ToolCall, ...] = ()
    """Expert calls replayed before the student acts (B2F)."""


def plan_episode(config: TCODConfig, k: int, turn_limit: int, expert_calls: tuple[ToolCall, ...] | None) -> EpisodePlan:
    """The plan for one episode given k, the loop's turn limit and τ* (None: no expert success)."""
    if config.mode == "f2b":
        return EpisodePlan(k, min(k, turn_limit))
    if expert_calls is None or k >= len(expert_calls):
        return EpisodePlan(k, turn_limit)
    return EpisodePlan(k, turn_limit, tuple(expert_calls[:len(expert_calls) - k]))


class TCODCurriculum:
    """Plans each episode of a rollout worker; B2F loads τ* once."""

    def __init__(self, config: TCODConfig) -> None:
        self.config = config
        self.experts: dict[tuple[str, int], tuple[ToolCall, ...]] = {}
        if config.mode == "b2f":
            self.experts = load_expert_calls(config.expert_path)

    def plan(self, split: str, seed: int, step: int, turn_limit: int) -> tuple[EpisodePlan, bool]:
        """The episode's plan, and whether B2F had to fall back to pure student play (no τ*)."""
        calls = self.experts.get((split, seed))
        missing = self.config.mode == "b2f" and calls is None
        return plan_episode(self.config, horizon(self.config, step), turn_limit, calls), missing


EXPERT_FILE = "expert.parquet"
MANIFEST_FILE = "manifest.json"


def load_expert_calls(directory: str | Path) -> dict[tuple[str, int], tuple[ToolCall, ...]]:
    """τ* of every task the expert solved, by (split, seed), from `jobs.collect_expert`'s output."""
    import pyarrow.parquet as pq

    path = Path(directory) / EXPERT_FILE
    if not path.is_file():
        raise ValueError(f"algorithm.tcod.expert_path: no {EXPERT_FILE} in {directory} "
                         f"(write one with python -m jobs.collect_expert)")
    table = pq.read_table(path).to_pylist()
    return {(row["split"], row["seed"]): tuple(ToolCall(c["name"], c["arguments"]) for c in map(json.loads, row["calls"]))
            for row in table if row["success"]}
