"""The step record: one row of a run's metrics.parquet per learner step, typed and schema-checked.

Counters come in two kinds. Rollout workers and the buffer report *deltas* since the last
step (`Counts`), never totals: a restarted worker, a recreated buffer and a resumed run all
start their own counters at 0, and a rate computed from deltas stays right across all three.
The record's running totals (`episodes`, `rollout_tokens`, ...) are the previous record's
totals plus this step's deltas, so they also continue across `--resume`.

`read_records` reads a metrics.parquet written by an older version of this schema: columns it
lacks are filled with nulls, columns it has that this schema dropped are ignored.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from actors.counters import FORMAT_ERRORS_AT, TURNS_AT, WORKER_COUNTERS
from cluster.files import write_atomic

@dataclass(frozen=True)
class Counts:
    """Rollout activity since the last step, summed over the workers."""

    num_episodes: int = 0
    num_successes: int = 0
    num_turns: int = 0
    num_format_errors: int = 0
    num_response_tokens: int = 0
    num_prompt_tokens: int = 0
    num_success_turns: int = 0
    """Turns of the successful episodes."""
    num_memory_turns: int = 0
    """Working-memory responses (the turns above are environment steps, their actions)."""
    num_memory_format_errors: int = 0
    num_env_restarts: int = 0
    """Episodes started over because their environment actor died (actors/env_actor.py)."""
    num_agent_failures: int = 0
    """Episodes whose agent program failed (the gateway: crashed, no reward, timed out)."""
    turns_by_index: tuple[int, ...] = ()
    """The student's turns at each turn index."""
    format_errors_by_index: tuple[int, ...] = ()

    @classmethod
    def sum(cls, deltas: list[dict[str, float]]) -> "Counts":
        def by_index(prefix: str) -> tuple[int, ...]:
            counts: dict[int, float] = {}
            for d in deltas:
                for key, value in d.items():
                    if key.startswith(prefix):
                        index = int(key[len(prefix):])
                        counts[index] = counts.get(index, 0) + value
            return tuple(int(counts.get(i, 0)) for i in range(max(counts, default=-1) + 1))

        turns, errors = by_index(TURNS_AT), by_index(FORMAT_ERRORS_AT)
        return cls(**{key: int(sum(d.get(key, 0) for d in deltas)) for key in WORKER_COUNTERS},
                   turns_by_index=turns, format_errors_by_index=errors + (0,) * (len(turns) - len(errors)))


@dataclass(frozen=True)
class StepRecord:
    """One learner step of the main loop."""

    version: int
    """Learner version after this step."""
    time: float
    """Unix time at the end of the step."""
    loss: float
    grad_norm: float
    entropy: float
    """Mean policy entropy over the trained tokens."""
    reverse_kl: float
    """Mean sampled-token reverse KL(student || teacher) over the trained tokens (0 without a teacher)."""
    topk_kl: float
    """Mean forward KL to the teacher's top-k (0 when the top-k term is off)."""
    clip_frac: float
    mismatch_kl: float
    """k3 estimate of KL(behaviour || policy) on the trained tokens."""
    num_samples: int
    """The buffer's samples the step trained."""
    num_past_samples: int
    """Past samples the step trained beside them (jobs.aggregate: demonstrations, replayed batches)."""
    num_loss_tokens: int
    max_staleness: int
    mean_staleness: float
    sample_versions: list[int]
    """Version each trained sample's staleness was counted from (buffer.staleness_of: its own
    policy version, its episode's last turn's, or its group's newest turn's), shape [num_samples]."""
    learner_step_s: float
    learner_idle_s: float
    """Time the learner waited for the batch."""
    weight_sync_s: float
    wall_s: float
    """Wall clock since the previous step."""
    buffer_occupancy: float
    buffer_resident: int
    num_rollout_workers: int
    """Rollout workers that answered this step (restarting ones do not; a teacher its algorithm's
    schedule stops leaves its bundles to more)."""
    # Running totals (across resumes) and this step's rates.
    episodes: int
    successes: int
    turns: int
    format_errors: int
    rollout_tokens: int
    prompt_tokens: int
    buffer_put: int
    buffer_consumed: int
    dropped_stale: int
    evicted: int
    duplicate_groups: int
    duplicate_turns: int
    """Rows of turns the buffer had stored already (a re-run group's turns that segments delivered)."""
    rollout_failed_runs: int
    teacher_restarts: int
    nonfinite_steps: int | None
    """Learner steps skipped so far because their loss or gradient norm was not finite (None in
    records written before the guard existed)."""
    empty_batches: int | None
    """Batches skipped so far because they held no trainable token (None in older records)."""
    env_restarts: int
    """Episodes started over because their environment actor died (rollout.env_actors)."""
    judged_turns: int | None
    """Turns the judge scored so far (None without a judge)."""
    judge_neutral_turns: int | None
    """... of which got no score after the judge's retries (neutral reward)."""
    train_success_rate: float | None
    """Success rate of the episodes that finished during this step; None when none did."""
    format_error_rate: float | None
    """Format errors per turn over this step's finished episodes, memory responses included
    (a turn is an environment step); None when none finished."""
    memory_turns: int
    """Working-memory responses so far (0 without `rollout.loop.working_memory`)."""
    memory_format_error_rate: float | None
    """Empty memories, or memories holding a tool call, per memory response this step; None without any."""
    prompt_tokens_per_turn: float | None
    """Prompt tokens per environment step, both stages' prompts with working memory."""
    rollout_tokens_per_s: float
    reverse_kl_by_turn: list[float | None]
    """Mean sampled-token reverse KL of the trained tokens at each turn index (None: no token there)."""
    format_error_rate_by_turn: list[float | None]
    """Format errors per student turn at each turn index, over this step's finished episodes."""
    response_tokens_per_turn: float | None
    """Mean generated tokens per turn over this step's finished episodes."""
    turns_to_success: float | None
    """Mean turns of this step's successful episodes; None when none succeeded."""
    reverse_kl_head: float | None
    """Sampled-token reverse KL over the first half of each trained response's tokens (None: nothing scored)."""
    reverse_kl_tail: float | None
    """... over the second half: a tail above the head says the teacher's signal weakens late in a response."""
    student_logprob_head: float | None
    """Mean behaviour log-prob of the trained tokens in the first half of their response."""
    student_logprob_tail: float | None
    gauges: dict[str, float]
    """The algorithm's gauges (learner.algorithms.Gauge: λ, TCOD's horizon k, ...) by name; {} for
    an algorithm without any."""
    teacher_stopped: bool | None
    """The algorithm's schedule had stopped the teacher when this step trained (TeacherSchedule):
    no teacher scored its samples (None in records written before)."""
    eval_success: float | None = None
    """Greedy eval success on run.eval_split (steps with an eval only)."""
    eval_success_by_type: dict[str, float] | None = field(default=None)
    """Eval success per task type."""
    buffer_lost: int | None = None
    """Samples that were resident in a buffer a resume or recovery replaced (as of the record it
    continued from): with them, buffer_put = consumed + dropped_stale + evicted + resident + lost
    (None in records written before)."""
    job_recoveries: int | None = None
    """Times the job rebuilt its actors from a checkpoint after a failure (run.max_failures)."""
    reverse_kl_episode: float | None = None
    """Sampled-token reverse KL summed over each episode's trained tokens in the batch, averaged
    over the batch's episodes: the trajectory-level quantity document 003 reports (None: nothing scored)."""
    ratio_mean: float | None = None
    """Mean importance ratio pi_theta/mu over the trained tokens (None in records written before)."""
    ratio_max: float | None = None
    """Largest importance ratio pi_theta/mu of a trained token."""
    masked_frac: float | None = None
    """Share of trained tokens the mismatch masks left out (seq_mask_band, token_mask_band)."""
    truncated_frac: float | None = None
    """Share of trained tokens whose ratio (or, decoupled, behaviour weight) tis_cap truncated."""
    agent_failures: int | None = None
    """Episodes so far whose agent program failed (env.name=gateway: it crashed, exited without a
    reward or timed out; each ends as a failed episode); None in records written before."""
    lr: float | None = None
    """The rate the step's updates took (learner.schedule; None in records written before)."""


def last_and_best_eval(records: list[StepRecord]) -> tuple[StepRecord, StepRecord] | None:
    """The last evaluated record and the best (the earliest of equals); None before any eval."""
    evaluated = [r for r in records if r.eval_success is not None]
    if not evaluated:
        return None
    return evaluated[-1], max(evaluated, key=lambda r: r.eval_success)


class RunLog(Protocol):
    """Somewhere a run's step records also go (jobs.tensorboard, jobs.wandb_log)."""

    def scalar(self, tag: str, value: float, version: int) -> None:
        """One number outside the step records (the warm start's loss and eval)."""

    def record(self, record: StepRecord) -> None:
        """A learner step's record."""

    def figures(self, paths: list[Path], version: int) -> None:
        """The report's figures, at the end of the job."""

    def close(self) -> None: ...


STEP_SCHEMA = pa.schema([
    ("version", pa.int64()), ("time", pa.float64()), ("loss", pa.float64()), ("grad_norm", pa.float64()),
    ("entropy", pa.float64()), ("reverse_kl", pa.float64()), ("topk_kl", pa.float64()), ("clip_frac", pa.float64()),
    ("mismatch_kl", pa.float64()), ("num_samples", pa.int64()), ("num_past_samples", pa.int64()), ("num_loss_tokens", pa.int64()),
    ("max_staleness", pa.int64()), ("mean_staleness", pa.float64()), ("sample_versions", pa.list_(pa.int64())),
    ("learner_step_s", pa.float64()), ("learner_idle_s", pa.float64()), ("weight_sync_s", pa.float64()),
    ("wall_s", pa.float64()), ("buffer_occupancy", pa.float64()), ("buffer_resident", pa.int64()),
    ("num_rollout_workers", pa.int64()),
    ("episodes", pa.int64()), ("successes", pa.int64()), ("turns", pa.int64()), ("format_errors", pa.int64()),
    ("rollout_tokens", pa.int64()), ("prompt_tokens", pa.int64()), ("buffer_put", pa.int64()),
    ("buffer_consumed", pa.int64()), ("dropped_stale", pa.int64()), ("evicted", pa.int64()),
    ("duplicate_groups", pa.int64()), ("duplicate_turns", pa.int64()), ("rollout_failed_runs", pa.int64()), ("teacher_restarts", pa.int64()),
    ("nonfinite_steps", pa.int64()), ("empty_batches", pa.int64()), ("env_restarts", pa.int64()),
    ("judged_turns", pa.int64()), ("judge_neutral_turns", pa.int64()), ("train_success_rate", pa.float64()), ("format_error_rate", pa.float64()),
    ("memory_turns", pa.int64()), ("memory_format_error_rate", pa.float64()), ("prompt_tokens_per_turn", pa.float64()), ("rollout_tokens_per_s", pa.float64()),
    ("reverse_kl_by_turn", pa.list_(pa.float64())), ("format_error_rate_by_turn", pa.list_(pa.float64())),
    ("response_tokens_per_turn", pa.float64()), ("turns_to_success", pa.float64()),
    ("reverse_kl_head", pa.float64()), ("reverse_kl_tail", pa.float64()),
    ("student_logprob_head", pa.float64()), ("student_logprob_tail", pa.float64()),
    ("gauges", pa.map_(pa.string(), pa.float64())), ("teacher_stopped", pa.bool_()),
    ("eval_success", pa.float64()), ("eval_success_by_type", pa.map_(pa.string(), pa.float64())),
    ("buffer_lost", pa.int64()), ("job_recoveries", pa.int64()), ("reverse_kl_episode", pa.float64()),
    ("ratio_mean", pa.float64()), ("ratio_max", pa.float64()), ("masked_frac", pa.float64()),
    ("truncated_frac", pa.float64()), ("agent_failures", pa.int64()), ("lr", pa.float64()),
])
"""Arrow schema of metrics.parquet; one row per StepRecord, same field names and order."""

assert [f.name for f in fields(StepRecord)] == STEP_SCHEMA.names, "StepRecord and STEP_SCHEMA disagree"

_TOTALS = {"episodes": "num_episodes", "successes": "num_successes", "turns": "num_turns",
           "format_errors": "num_format_errors", "rollout_tokens": "num_response_tokens",
           "prompt_tokens": "num_prompt_tokens", "memory_turns": "num_memory_turns",
           "env_restarts": "num_env_restarts", "agent_failures": "num_agent_failures"}
_BUFFER_TOTALS = {"buffer_put": "num_put", "buffer_consumed": "num_consumed", "dropped_stale": "num_dropped_stale",
                  "evicted": "num_evicted", "duplicate_groups": "num_duplicate_groups",
                  "duplicate_turns": "num_duplicate_turns"}
BUFFER_COUNTERS = tuple(_BUFFER_TOTALS.values())
"""The buffer `stats` counters the record totals (the driver passes their deltas)."""


def running_totals(previous: StepRecord | None, counts: Counts, buffer_delta: dict[str, int],
                   failed_runs: int, teacher_restarts: int, wall_s: float) -> dict[str, Any]:
    """The record's totals and rates from the previous record and this step's deltas."""
    def before(name: str) -> int:
        value = None if previous is None else getattr(previous, name)
        return value or 0

    out: dict[str, Any] = {name: before(name) + getattr(counts, key) for name, key in _TOTALS.items()}
    out.update({name: before(name) + int(buffer_delta.get(key, 0)) for name, key in _BUFFER_TOTALS.items()})
    out["rollout_failed_runs"] = before("rollout_failed_runs") + failed_runs
    out["teacher_restarts"] = before("teacher_restarts") + teacher_restarts
    out["train_success_rate"] = counts.num_successes / counts.num_episodes if counts.num_episodes else None
    out["format_error_rate"] = counts.num_format_errors / counts.num_turns if counts.num_turns else None
    out["memory_format_error_rate"] = (counts.num_memory_format_errors / counts.num_memory_turns
                                       if counts.num_memory_turns else None)
    out["prompt_tokens_per_turn"] = counts.num_prompt_tokens / counts.num_turns if counts.num_turns else None
    out["response_tokens_per_turn"] = counts.num_response_tokens / counts.num_turns if counts.num_turns else None
    out["turns_to_success"] = counts.num_success_turns / counts.num_successes if counts.num_successes else None
    out["rollout_tokens_per_s"] = counts.num_response_tokens / max(wall_s, 1e-9)
    out["format_error_rate_by_turn"] = [errors / turns if turns else None
                                        for turns, errors in zip(counts.turns_by_index, counts.format_errors_by_index)]
    return out


def write_records(path: Path, records: list[StepRecord]) -> None:
    """Replace metrics.parquet atomically (cluster.files): a crash mid-write leaves the previous file."""
    table = pa.Table.from_pylist([asdict(r) for r in records], schema=STEP_SCHEMA)
    write_atomic(path, lambda tmp: pq.write_table(table, tmp))


def read_records(path: Path) -> list[StepRecord]:
    """Records of a metrics.parquet, older schemas included (missing columns become None).
    ValueError naming the file when it is not a readable parquet file (truncated, say)."""
    try:
        rows = pq.read_table(path).to_pylist()
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"{path} is damaged and cannot be read ({exc}); move it away to go on without the "
                         f"step records it held") from None
    names = STEP_SCHEMA.names
    records = []
    for row in rows:
        values = {name: row.get(name) for name in names}
        for name in ("eval_success_by_type", "gauges"):
            if isinstance(values[name], list):  # Arrow maps read back as (key, value) pairs
                values[name] = dict(values[name])
        if values["gauges"] is None:  # before the map, each gauge had a column of its own
            values["gauges"] = {name: row[name] for name in _GAUGE_COLUMNS if row.get(name) is not None}
        records.append(StepRecord(**values))
    return records


_GAUGE_COLUMNS = ("opd_lambda", "horizon_k")
"""The gauges older schemas recorded as columns (read into `gauges`)."""
