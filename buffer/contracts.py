"""Data contracts between rollout, teacher, buffer and learner, and their Arrow schemas.

`Trajectory` (one episode, a list of `Turn`s) is what rollout produces; `Sample` (one turn
with its episode's metadata) is what the learner trains on: an n-turn trajectory expands to
n samples (buffer.expansion). Batches of samples travel as Arrow tables (SAMPLE_SCHEMA) so
Ray moves them through the object store without copies; trajectories round-trip through
Arrow and Parquet too (TRAJECTORY_SCHEMA). Token ids are int32, log-probs float32.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, fields
from typing import Any

import pyarrow as pa


def check_topk(turn_index: int, num_response_tokens: int, ids, logprobs) -> None:
    """Top-k ids and log-probs come together, one row of the same width per response token."""
    if (ids is None) != (logprobs is None):
        raise ValueError(f"turn {turn_index}: teacher top-k ids and log-probs must both be set or both None")
    if ids is None:
        return
    if len(ids) != num_response_tokens or len(logprobs) != num_response_tokens:
        raise ValueError(f"turn {turn_index}: teacher top-k rows ({len(ids)}, {len(logprobs)}) "
                         f"for {num_response_tokens} response tokens")
    widths = {len(row) for row in ids} | {len(row) for row in logprobs}
    if len(widths) > 1:
        raise ValueError(f"turn {turn_index}: teacher top-k rows of different widths {sorted(widths)}")


def are_logprobs(values, tolerance: float = 1e-3) -> bool:
    """Every value finite and at most 0 (+ numerical slack). A NaN, an infinity or a positive
    value from an engine or a teacher is a broken source (a bf16 overflow, a server bug), never a
    confident one; where log-probs enter, such values are rejected."""
    return all(math.isfinite(v) and v <= tolerance for v in values)


STAGES = ("action", "memory")


@dataclass(frozen=True)
class Turn:
    """One agent turn: the prompt the engine saw and what it generated."""

    turn_index: int
    """Position of the turn in its episode, 0-based."""
    prompt_ids: tuple[int, ...]
    """Prompt token ids exactly as the engine saw them, shape [num_prompt_tokens]."""
    response_ids: tuple[int, ...]
    """Generated token ids, stop token included when hit, shape [num_response_tokens]."""
    behaviour_logprobs: tuple[float, ...]
    """Log-prob of each response token under the sampling policy, shape [num_response_tokens]."""
    policy_version: int
    """Learner version of the weights that generated the response."""
    teacher_logprobs: tuple[float, ...] | None = None
    """Teacher log-prob of each response token, shape [num_response_tokens]; None if unscored."""
    trainable: bool = True
    """False for turns that must not be trained (TCOD-B2F teacher-replayed turns)."""
    well_formed: bool = True
    """Whether the response parsed as a tool call."""
    turn_reward: float = 0.0
    """Reward attributed to this turn (gentle format penalty, judge score)."""
    finish_reason: str = "stop"
    """'stop' (end-of-turn token), 'length' (max new tokens) or 'context' (context limit)."""
    executed_call: str | None = None
    """JSON {"name", "arguments"} of the tool call the environment executed; None if nothing acted."""
    teacher_topk_ids: tuple[tuple[int, ...], ...] | None = None
    """The teacher's k most likely next tokens at each response position, shape [num_response_tokens, k];
    -1 pads a position where the teacher has fewer (or no) candidates. None: not requested."""
    teacher_topk_logprobs: tuple[tuple[float, ...], ...] | None = None
    """Teacher log-probs of `teacher_topk_ids`, shape [num_response_tokens, k] (0 on padding)."""
    stage: str = "action"
    """'action' (a response the environment executes) or 'memory' (a working-memory response,
    docs/algorithms.md §7: it precedes the action of the same environment step)."""

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if self.stage not in STAGES:
            raise ValueError(f"turn {self.turn_index}: stage {self.stage!r} is not one of {STAGES}")
        check_topk(self.turn_index, n, self.teacher_topk_ids, self.teacher_topk_logprobs)
        if len(self.behaviour_logprobs) != n:
            raise ValueError(f"turn {self.turn_index}: {len(self.behaviour_logprobs)} behaviour log-probs "
                             f"for {n} response tokens")
        if self.teacher_logprobs is not None and len(self.teacher_logprobs) != n:
            raise ValueError(f"turn {self.turn_index}: {len(self.teacher_logprobs)} teacher log-probs "
                             f"for {n} response tokens")


@dataclass(frozen=True)
class Trajectory:
    """One finished episode."""

    trajectory_id: str
    """Unique id of the episode."""
    group_id: str
    """Id shared by the G episodes of one GRPO group (same split and task seed)."""
    split: str
    """Split of the task."""
    task_seed: int
    """Seed of the task inside its split."""
    task_type: str
    """Task family, e.g. 'go_to'."""
    turns: tuple[Turn, ...]
    """The turns in order, shape [num_turns]."""
    success: bool
    """Verifier success."""
    outcome_reward: float
    """Outcome term of the episode reward."""
    format_reward: float
    """Format term of the episode reward."""
    horizon_k: int | None = None
    """TCOD horizon k in force when the episode ran; None without a curriculum."""
    advantage: float | None = None
    """Episode advantage set by the algorithm's group-end hook; None until then."""
    task: str = ""
    """The instruction text (privileged-context retrieval matches against it)."""

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    def env_steps(self) -> list[int]:
        """The environment step of each turn, shape [num_turns]: a memory turn belongs to the
        action that follows it; without working memory, turn k is step k."""
        return env_steps(self.turns)


def env_steps(turns) -> list[int]:
    steps, step = [], 0
    for turn in turns:
        steps.append(step)
        step += turn.stage == "action"
    return steps


@dataclass(frozen=True)
class Sample:
    """One training sample: turn k of a trajectory with its episode's metadata."""

    trajectory_id: str
    """Id of the source episode."""
    group_id: str
    """GRPO group id."""
    split: str
    """Split of the task."""
    task_seed: int
    """Seed of the task inside its split."""
    task_type: str
    """Task family."""
    turn_index: int
    """k: which turn of the episode this sample is."""
    num_turns: int
    """n: turns in the source episode."""
    prompt_ids: tuple[int, ...]
    """Prompt token ids of turn k as the engine saw them, shape [num_prompt_tokens]."""
    response_ids: tuple[int, ...]
    """Response token ids of turn k, shape [num_response_tokens]."""
    behaviour_logprobs: tuple[float, ...]
    """Sampling-policy log-prob per response token, shape [num_response_tokens]."""
    policy_version: int
    """Learner version of the weights that generated the response."""
    teacher_logprobs: tuple[float, ...] | None
    """Teacher log-prob per response token, shape [num_response_tokens], or None."""
    trainable: bool
    """False: the response is context only (no loss)."""
    well_formed: bool
    """Whether the response parsed."""
    turn_reward: float
    """Reward attributed to turn k."""
    outcome_reward: float
    """Episode outcome reward."""
    format_reward: float
    """Episode format reward."""
    success: bool
    """Episode success."""
    horizon_k: int | None
    """TCOD horizon k in force, or None."""
    advantage: float | None
    """Episode advantage from the group-end hook, or None."""
    finish_reason: str
    """How the response ended: 'stop', 'length' or 'context'."""
    teacher_topk_ids: tuple[tuple[int, ...], ...] | None = None
    """Teacher top-k token ids per response token, shape [num_response_tokens, k] (-1: padding), or None."""
    teacher_topk_logprobs: tuple[tuple[float, ...], ...] | None = None
    """Their teacher log-probs, shape [num_response_tokens, k], or None."""

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


_TOKENS = pa.list_(pa.int32())
_LOGPROBS = pa.list_(pa.float32())
_TOPK_IDS = pa.list_(_TOKENS)
_TOPK_LOGPROBS = pa.list_(_LOGPROBS)

SAMPLE_SCHEMA = pa.schema([
    ("trajectory_id", pa.string()), ("group_id", pa.string()), ("split", pa.string()),
    ("task_seed", pa.int64()), ("task_type", pa.string()), ("turn_index", pa.int32()),
    ("num_turns", pa.int32()), ("prompt_ids", _TOKENS), ("response_ids", _TOKENS),
    ("behaviour_logprobs", _LOGPROBS), ("policy_version", pa.int64()), ("teacher_logprobs", _LOGPROBS),
    ("trainable", pa.bool_()), ("well_formed", pa.bool_()), ("turn_reward", pa.float64()),
    ("outcome_reward", pa.float64()), ("format_reward", pa.float64()), ("success", pa.bool_()),
    ("horizon_k", pa.int32()), ("advantage", pa.float64()), ("finish_reason", pa.string()),
    ("teacher_topk_ids", _TOPK_IDS), ("teacher_topk_logprobs", _TOPK_LOGPROBS),
])
"""Arrow schema of a batch of samples; one row per Sample, same field names."""

TURN_TYPE = pa.struct([
    ("turn_index", pa.int32()), ("prompt_ids", _TOKENS), ("response_ids", _TOKENS),
    ("behaviour_logprobs", _LOGPROBS), ("policy_version", pa.int64()), ("teacher_logprobs", _LOGPROBS),
    ("trainable", pa.bool_()), ("well_formed", pa.bool_()), ("turn_reward", pa.float64()),
    ("finish_reason", pa.string()), ("executed_call", pa.string()),
    ("teacher_topk_ids", _TOPK_IDS), ("teacher_topk_logprobs", _TOPK_LOGPROBS), ("stage", pa.string()),
])
TRAJECTORY_SCHEMA = pa.schema([
    ("trajectory_id", pa.string()), ("group_id", pa.string()), ("split", pa.string()),
    ("task_seed", pa.int64()), ("task_type", pa.string()), ("turns", pa.list_(TURN_TYPE)),
    ("success", pa.bool_()), ("outcome_reward", pa.float64()), ("format_reward", pa.float64()),
    ("horizon_k", pa.int32()), ("advantage", pa.float64()), ("task", pa.string()),
])
"""Arrow schema of a batch of trajectories; turns are a nested list of structs."""

_SAMPLE_FIELDS = [f.name for f in fields(Sample)]
_TRAJECTORY_FIELDS = [f.name for f in fields(Trajectory)]
_TURN_FIELDS = [f.name for f in fields(Turn)]
_TUPLE_FIELDS = {"prompt_ids", "response_ids", "behaviour_logprobs", "teacher_logprobs"}
_NESTED_TUPLE_FIELDS = {"teacher_topk_ids", "teacher_topk_logprobs"}
assert _SAMPLE_FIELDS == SAMPLE_SCHEMA.names and _TRAJECTORY_FIELDS == TRAJECTORY_SCHEMA.names
assert _TURN_FIELDS == [TURN_TYPE.field(i).name for i in range(TURN_TYPE.num_fields)]


def _row(obj: Any, names: list[str]) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in names}


def _from_row(row: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in row.items():
        if v is not None and k in _TUPLE_FIELDS:
            v = tuple(v)
        elif v is not None and k in _NESTED_TUPLE_FIELDS:
            v = tuple(tuple(r) for r in v)
        out[k] = v
    return out


def samples_to_table(samples: list[Sample]) -> pa.Table:
    """A batch of samples as an Arrow table with SAMPLE_SCHEMA."""
    return pa.Table.from_pylist([_row(s, _SAMPLE_FIELDS) for s in samples], schema=SAMPLE_SCHEMA)


def table_to_samples(table: pa.Table) -> list[Sample]:
    """Inverse of samples_to_table (log-probs come back as float32 values)."""
    if table.schema.names != SAMPLE_SCHEMA.names:
        raise ValueError(f"not a sample table: columns {table.schema.names}")
    return [Sample(**_from_row(row)) for row in table.to_pylist()]


def trajectories_to_table(trajectories: list[Trajectory]) -> pa.Table:
    """A batch of trajectories as an Arrow table with TRAJECTORY_SCHEMA."""
    rows = []
    for t in trajectories:
        row = _row(t, _TRAJECTORY_FIELDS)
        row["turns"] = [_row(turn, _TURN_FIELDS) for turn in t.turns]
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA)


def table_to_trajectories(table: pa.Table) -> list[Trajectory]:
    """Inverse of trajectories_to_table."""
    if table.schema.names != TRAJECTORY_SCHEMA.names:
        raise ValueError(f"not a trajectory table: columns {table.schema.names}")
    out = []
    for row in table.to_pylist():
        row["turns"] = tuple(Turn(**_from_row(turn)) for turn in row["turns"])
        out.append(Trajectory(**row))
    return out
