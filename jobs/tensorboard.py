"""TensorBoard event files of a run (`run.tensorboard: true`): every step record's numbers.

The run writes under RUN_DIR/tensorboard, so `tensorboard --logdir runs/` shows every run
under runs/ side by side. Tags are `<section>/<field>` with the field names of metrics.parquet
(jobs.records.StepRecord); per-turn-index and per-task-type lists become one tag per entry
(`kl/reverse_kl_by_turn/03`, `eval/success_by_type/pick_up`); the step is the learner version,
the same x axis as jobs.report. A resumed run appends a new event file to the same directory.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import numpy as np

from jobs.records import StepRecord

SECTIONS: dict[str, str] = {
    "loss": "learner", "grad_norm": "learner", "lr": "learner", "entropy": "learner", "clip_frac": "learner",
    "mismatch_kl": "mismatch", "ratio_mean": "mismatch", "ratio_max": "mismatch", "masked_frac": "mismatch",
    "truncated_frac": "mismatch", "num_samples": "learner", "num_past_samples": "learner", "num_loss_tokens": "learner", "max_staleness": "learner",
    "mean_staleness": "learner", "learner_step_s": "time", "learner_idle_s": "time", "weight_sync_s": "time",
    "wall_s": "time", "reverse_kl": "kl", "topk_kl": "kl", "reverse_kl_by_turn": "kl", "reverse_kl_episode": "kl", "reverse_kl_head": "kl",
    "reverse_kl_tail": "kl", "student_logprob_head": "kl", "student_logprob_tail": "kl",
    "buffer_occupancy": "buffer", "buffer_resident": "buffer", "buffer_put": "buffer", "buffer_consumed": "buffer",
    "dropped_stale": "buffer", "evicted": "buffer", "duplicate_groups": "buffer", "duplicate_turns": "buffer",
    "num_rollout_workers": "faults", "rollout_failed_runs": "faults", "teacher_restarts": "faults", "nonfinite_steps": "faults", "empty_batches": "faults", "env_restarts": "faults", "agent_failures": "faults", "buffer_lost": "faults", "job_recoveries": "faults",
    "judged_turns": "judge", "judge_neutral_turns": "judge",
    "episodes": "rollout", "successes": "rollout", "turns": "rollout", "format_errors": "rollout", "memory_turns": "rollout",
    "rollout_tokens": "rollout", "prompt_tokens": "rollout", "train_success_rate": "rollout",
    "format_error_rate": "rollout", "prompt_tokens_per_turn": "rollout", "rollout_tokens_per_s": "rollout",
    "memory_format_error_rate": "rollout",
    "format_error_rate_by_turn": "rollout", "response_tokens_per_turn": "rollout", "turns_to_success": "rollout",
    "gauges": "schedule", "teacher_stopped": "schedule",
    "eval_success": "eval", "eval_success_by_type": "eval",
}
"""TensorBoard section of each StepRecord field that holds numbers."""
NOT_LOGGED = ("version", "time", "sample_versions")
"""Fields that are the x axis, a timestamp, or logged as the staleness histogram instead."""

assert set(SECTIONS) | set(NOT_LOGGED) == {f.name for f in fields(StepRecord)}, \
    "every StepRecord field needs a TensorBoard section (jobs/tensorboard.py SECTIONS) or a place in NOT_LOGGED"


def scalars(record: StepRecord) -> list[tuple[str, float]]:
    """(tag, value) of every number the record holds; None (not measured this step) is left out."""
    out = []
    for name, section in SECTIONS.items():
        value = getattr(record, name)
        if value is None:
            continue
        if isinstance(value, dict):
            out += [(f"{section}/{name}/{key}", float(v)) for key, v in sorted(value.items())]
        elif isinstance(value, list):
            out += [(f"{section}/{name}/{i:02d}", float(v)) for i, v in enumerate(value) if v is not None]
        else:
            out.append((f"{section}/{name}", float(value)))
    return out


class TensorBoardLog:
    """One event-file writer per run process."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(log_dir))

    def scalar(self, tag: str, value: float, version: int) -> None:
        self.writer.add_scalar(tag, value, version)

    def record(self, record: StepRecord) -> None:
        for tag, value in scalars(record):
            self.writer.add_scalar(tag, value, record.version)
        if record.sample_versions:
            # Staleness of the trained samples: the learner trained version `record.version - 1`.
            staleness = np.array([record.version - 1 - v for v in record.sample_versions])
            self.writer.add_histogram("learner/staleness", staleness, record.version)
        self.writer.flush()

    def figures(self, paths: list[Path], version: int) -> None:
        import matplotlib.image

        for path in paths:
            self.writer.add_image(f"report/{path.stem}", matplotlib.image.imread(path), version, dataformats="HWC")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
