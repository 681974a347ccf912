"""The step recorder: one `StepRecord` per learner step (docs/architecture.md, "Step records").

Actors count from zero whenever they start (a restarted worker, the new buffer of a resumed or
recovered run) while a record's totals continue over the whole run, so the recorder keeps what
it saw at the previous step and turns every source into this step's delta: rollout workers
report their deltas themselves, the buffer's and the judge's counters are diffed here, and a
teacher service's restarts are Ray's count of them. A service that does not answer in time (hung
until a worker kills it, or restarting) never stalls a record: its gauges sit out that step. A
resume or a recovery starts a new recorder from the records it keeps (`restore`) and the faults
the replaced run counted after them (`faults`).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from typing import Any

from cluster.actor_state import actor_state
from jobs.records import BUFFER_COUNTERS, Counts, StepRecord, running_totals

FAULT_TOTALS = ("rollout_failed_runs", "teacher_restarts", "env_restarts")
"""Record totals of restarts in place: a recovery keeps them, although it trains the steps after
its checkpoint again (their records are replaced)."""

SERVICE_STATS_TIMEOUT_S = 5.0
"""How long a record waits for the teacher services' and the judge's gauges: they are busy or
hung at worst, and the rollout workers, not the recorder, tell a hang (rollout.service_timeout_s)."""


class NonFiniteTraining(RuntimeError):
    """The learner skipped run.max_nonfinite_steps steps in a row (non-finite, or nothing to train)."""


class NoLearningSignal(RuntimeError):
    """run.max_groups_without_signal groups in a row were dropped for carrying no signal."""


class SignalWatch:
    """Groups in a row that the group-end stages dropped for carrying no signal (under GRPO: every
    episode of the group got the same reward), read from the pool's running GROUP_TOTALS now and
    then. Such a run does not stall (a rare group with signal still reaches the learner) but no
    longer learns: a policy whose tool calls stopped parsing fails every episode alike, and a
    checkpoint rebuilt by a recovery is the same policy. The watch names the cause instead."""

    def __init__(self, limit: int | None) -> None:
        """`limit`: run.max_groups_without_signal (None: never stop)."""
        self.limit = limit
        self._start: dict[str, int] | None = None  # the totals when the current streak began

    def update(self, totals: dict[str, int]) -> str | None:
        """`totals`: the pool's GROUP_TOTALS now. Returns the cause to stop for once the streak
        reaches the limit, else None. A group with signal since the last read, or a restarted
        worker (totals that went down), starts a new streak."""
        if self.limit is None:
            return None
        start = self._start
        if start is None or _with_signal(totals) != _with_signal(start) or \
                totals["num_groups_delivered"] < start["num_groups_delivered"]:
            self._start = dict(totals)
            return None
        streak = {key: totals[key] - start[key] for key in totals}
        return _no_signal_cause(streak) if streak["num_groups_without_signal"] >= self.limit else None


def _with_signal(totals: dict[str, int]) -> int:
    return totals["num_groups_delivered"] - totals["num_groups_without_signal"]


def _no_signal_cause(streak: dict[str, int]) -> str:
    """What a streak of groups without signal says about the policy, and what to change."""
    success = streak["num_successes_without_signal"] / max(streak["num_episodes_without_signal"], 1)
    format_errors = streak["num_format_errors_without_signal"] / max(streak["num_turns_without_signal"], 1)
    if success >= 0.5:
        why = ("the policy solves these training tasks: nothing is left to learn from them (a harder level, or "
               "run.target_eval_success to stop on reaching a success)")
    elif format_errors >= 0.5:
        why = ("the policy's tool calls do not parse: a format never learned (a warm start) or collapsed (resume "
               "from an earlier checkpoint with a lower learner.lr: --allow-change learner.lr)")
    else:
        why = ("the policy fails every task alike: too hard for it (a warm start, an easier level, or a teacher: "
               "OPD and joint losses keep such groups)")
    return (f"the last {streak['num_groups_without_signal']} groups the workers finished "
            f"({streak['num_episodes_without_signal']} episodes) carried no learning signal, every episode of a "
            f"group the same reward (success {success:.2f}, format errors on {format_errors:.2f} of the turns): "
            f"{why}; learner.algorithm.drop_zero_variance_groups=false trains on them anyway, "
            f"run.max_groups_without_signal=null waits")


class StepRecorder:
    """Builds, keeps and exports the run's step records."""

    def __init__(self, metrics, recoveries: int = 0, faults: dict[str, int] | None = None) -> None:
        """`metrics`: the run's MetricsExporter; `recoveries`: the job's recoveries before this run;
        `faults`: the FAULT_TOTALS the run it replaces had reached."""
        self.metrics = metrics
        self.recoveries = recoveries
        self.rows: list[StepRecord] = []
        self._teacher_restarts: list[int] = []
        """Ray's restart count of each teacher service at the last step."""
        self._failed_runs_seen = 0
        """The pool's failed-run count at the last step (rows count failures across resumes)."""
        self._buffer_seen: dict[str, int] = {}
        self._judge_seen: dict[str, int] = {}
        self._judge_incarnation: int | None = None
        """The judge's counters at the last step, and which incarnation counted them."""
        self.nonfinite_steps = 0
        """Learner steps skipped for a non-finite loss or gradient norm (this run and the ones it resumed)."""
        self.empty_batches = 0
        """Batches skipped for holding no trainable token."""
        self._skipped_in_row = 0
        self.buffer_lost = 0
        """Samples resident in the buffers that resumes and recoveries replaced (StepRecord.buffer_lost)."""
        self._faults = dict(faults or {})
        """FAULT_TOTALS of the replaced run; what its records after the checkpoint held goes into the next record."""

    def restore(self, rows: list[StepRecord]) -> None:
        """Go on from the records a checkpoint kept (a resume or a recovery; `rows` end at its version)."""
        self.rows = list(rows)
        last = self.rows[-1] if self.rows else None
        self.nonfinite_steps = (last.nonfinite_steps or 0) if last else 0
        self.empty_batches = (last.empty_batches or 0) if last else 0
        # What the replaced buffer held at that record is gone; the counts it was part of continue.
        self.buffer_lost = ((last.buffer_lost or 0) + last.buffer_resident) if last else 0
        # The steps after the checkpoint are trained again, but the restarts in them did happen.
        self._faults = {key: max(0, value - ((getattr(last, key) or 0) if last else 0))
                        for key, value in self._faults.items()}

    def teachers_replaced(self) -> None:
        """The teacher services went (a schedule stopped them): their restart counts are no longer diffed."""
        self._teacher_restarts = []

    def skipped(self, stats: dict, version: int, limit: int) -> None:
        """A step the learner skipped changed nothing (learner.trainer): its loss or gradient norm
        was not finite, or its batch had no trainable token. Counted (`nonfinite_steps`,
        `empty_batches`); `limit` skips in a row raise NonFiniteTraining."""
        nonfinite = stats["skipped"] == "nonfinite"
        if nonfinite:
            self.nonfinite_steps += 1
        else:
            self.empty_batches += 1
        self._skipped_in_row += 1
        self.metrics.inc("nonfinite_steps" if nonfinite else "empty_batches", 1)
        what = (f"loss {stats['loss']} grad_norm {stats['grad_norm']}" if nonfinite
                else "no trainable token in the batch")
        print(f"step skipped at version {version}: {what} ({self._skipped_in_row} in a row; "
              f"{self.nonfinite_steps} non-finite, {self.empty_batches} empty in all)", flush=True)
        if self._skipped_in_row >= limit:
            hint = ("lower learner.lr, check the teacher's log-probs" if nonfinite else
                    "check which turns are trainable (replayed, unselected or untrainable turns carry no loss)")
            raise NonFiniteTraining(
                f"{limit} learner steps in a row were skipped (last: {what}) at version {version}; {hint}, "
                f"or raise run.max_nonfinite_steps")

    def record(self, version: int, stats: dict, versions: list[int], timing: dict[str, float], actors: dict[str, Any],
               gauges: dict[str, float], teacher_stopped: bool, num_past_samples: int = 0) -> StepRecord:
        """The record of the step that made `version` from the learner's `stats` and the batch's
        policy `versions` (the buffer's samples; `num_past_samples` of jobs.aggregate's beside
        them); `timing`: idle, sync and wall seconds; `actors`: the buffer, the pool, the teacher
        services and the judge (or None) to ask for their counts; `gauges`: the algorithm's by
        name; `teacher_stopped`: its schedule had stopped the teacher."""
        import ray

        self._skipped_in_row = 0
        pool = actors["pool"]
        buffer = ray.get(actors["buffer"].stats.remote())
        worker_stats = pool.stats()
        counts = Counts.sum(worker_stats)
        teachers = [answer for answer in answers_within(actors["teachers"], SERVICE_STATS_TIMEOUT_S) if answer]
        restarts = [actor_state(t).num_restarts for t in actors["teachers"]]
        teacher_restarts = sum(new - old for old, new in zip(self._teacher_restarts, restarts))
        self._teacher_restarts = restarts
        buffer_delta = {key: int(buffer[key]) - self._buffer_seen.get(key, 0) for key in BUFFER_COUNTERS}
        self._buffer_seen = {key: int(buffer[key]) for key in BUFFER_COUNTERS}
        failed_runs = pool.num_failed_runs - self._failed_runs_seen
        self._failed_runs_seen = pool.num_failed_runs
        faults, self._faults = self._faults, {}
        failed_runs += faults.get("rollout_failed_runs", 0)
        teacher_restarts += faults.get("teacher_restarts", 0)
        counts = dataclasses.replace(counts, num_env_restarts=counts.num_env_restarts + faults.get("env_restarts", 0))
        previous = self.rows[-1] if self.rows else None
        totals = running_totals(previous, counts, buffer_delta, failed_runs, teacher_restarts, timing["wall"])
        staleness = [version - 1 - v for v in versions]
        record = StepRecord(
            version=version, time=time.time(), loss=stats["loss"], grad_norm=stats["grad_norm"],
            entropy=stats["entropy"], reverse_kl=stats["reverse_kl"], topk_kl=stats["topk_kl"],
            clip_frac=stats["clip_frac"], mismatch_kl=stats["mismatch_kl"],
            reverse_kl_by_turn=stats["reverse_kl_by_turn"], num_samples=len(versions),
            num_past_samples=num_past_samples,
            **{key: stats[key] for key in ("reverse_kl_head", "reverse_kl_tail", "student_logprob_head",
                                           "student_logprob_tail", "reverse_kl_episode", "ratio_mean", "ratio_max",
                                           "masked_frac", "truncated_frac")},
            num_loss_tokens=int(stats["num_loss_tokens"]), max_staleness=max(staleness, default=0),
            mean_staleness=sum(staleness) / max(len(staleness), 1), sample_versions=versions,
            learner_step_s=stats["step_s"], learner_idle_s=timing["idle"], weight_sync_s=timing["sync"],
            wall_s=timing["wall"], buffer_occupancy=buffer["occupancy"], buffer_resident=int(buffer["num_resident"]),
            num_rollout_workers=len(worker_stats), nonfinite_steps=self.nonfinite_steps,
            empty_batches=self.empty_batches, buffer_lost=self.buffer_lost, job_recoveries=self.recoveries,
            gauges=gauges, teacher_stopped=teacher_stopped, lr=stats["lr"], **totals,
            **self._judge_counts(actors["judge"], previous))
        self._export(record, counts, buffer_delta, failed_runs, teacher_restarts, teachers)
        return record

    def _judge_counts(self, judge, previous: StepRecord | None) -> dict[str, int | None]:
        """The judge's totals: its counters since it started, diffed like the buffer's; the last
        record's when it does not answer in time."""
        counts: dict[str, int | None] = {"judged_turns": None, "judge_neutral_turns": None}
        if judge is None:
            return counts
        now = answers_within([judge], SERVICE_STATS_TIMEOUT_S)[0]
        if now is None:
            return {field: getattr(previous, field, None) for field in counts}
        incarnation = actor_state(judge).num_restarts
        # A restarted judge counts from 0 (what its predecessor counted after the last answer is lost).
        seen = self._judge_seen if incarnation == self._judge_incarnation else {}
        for field, key in (("judged_turns", "num_turns_judged"), ("judge_neutral_turns", "num_neutral")):
            counts[field] = (getattr(previous, field, None) or 0) + now[key] - seen.get(key, 0)
        self._judge_seen, self._judge_incarnation = now, incarnation
        return counts

    def _export(self, record: StepRecord, counts: Counts, buffer_delta: dict[str, int], failed_runs: int,
                teacher_restarts: int, teachers: list[dict]) -> None:
        m = self.metrics
        m.set("learner_version", record.version)
        m.set("learner_step_seconds", record.learner_step_s)
        m.set("learner_idle_seconds", record.learner_idle_s)
        m.set("weight_sync_seconds", record.weight_sync_s)
        m.set("buffer_occupancy", record.buffer_occupancy)
        for s, n in Counter(record.version - 1 - v for v in record.sample_versions).items():
            m.observe("consumed_staleness", s, n)
        m.set("rollout_tokens_per_s", record.rollout_tokens_per_s)
        # Rates over the episodes that finished since the last step; a step without any keeps the
        # previous values (episodes finish in bursts).
        if record.format_error_rate is not None:
            m.set("format_error_rate", record.format_error_rate)
            m.set("rollout_prompt_tokens_per_turn", record.prompt_tokens_per_turn)
        m.set("opd_reverse_kl", record.reverse_kl)
        for name in ("mismatch_kl", "ratio_mean", "ratio_max", "masked_frac", "truncated_frac"):
            m.set(f"learner_{name}", getattr(record, name))
        for name, value in record.gauges.items():
            m.set(name, value)
        m.set("teacher_stopped", float(record.teacher_stopped))
        if teachers:
            m.set("teacher_latency_seconds", max(t["latency_p50_s"] for t in teachers))
            m.set("teacher_batch_turns", sum(t["mean_batch_turns"] for t in teachers) / len(teachers))
        m.inc("episodes", counts.num_successes, task_type="all", outcome="success")
        m.inc("episodes", counts.num_episodes - counts.num_successes, task_type="all", outcome="failure")
        m.inc("buffer_dropped", buffer_delta["num_dropped_stale"], reason="stale")
        m.inc("buffer_dropped", buffer_delta["num_evicted"], reason="evicted")
        m.inc("actor_restarts", teacher_restarts, component="teacher")
        m.inc("actor_restarts", failed_runs, component="rollout")
        m.inc("actor_restarts", counts.num_env_restarts, component="env")
        m.inc("agent_failures", counts.num_agent_failures)

    def fault_totals(self, pool_failed_runs: int) -> dict[str, int]:
        """FAULT_TOTALS as the last record has them, plus the rollout failures the pool saw since
        (`pool_failed_runs`: its count now): a recovery carries them over."""
        last = self.rows[-1] if self.rows else None
        totals = {key: (getattr(last, key) or 0) if last else 0 for key in FAULT_TOTALS}
        totals["rollout_failed_runs"] += pool_failed_runs - self._failed_runs_seen
        return totals


def answers_within(services: list, timeout_s: float) -> list[dict | None]:
    """Each service's `stats()`, or None for one that did not answer within `timeout_s` or died
    under the call."""
    import ray

    refs = [service.stats.remote() for service in services]
    ready = set(ray.wait(refs, num_returns=len(refs), timeout=timeout_s)[0]) if refs else set()
    answers: list[dict | None] = []
    for ref in refs:
        try:
            answers.append(ray.get(ref) if ref in ready else None)
        except ray.exceptions.RayActorError:
            answers.append(None)
    return answers
