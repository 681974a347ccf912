"""Where a run is, from its run directory: for a job started with `ray job submit` as for a local
one, without reading its logs.

    python -m jobs.status RUN_DIR
    python -m jobs.status --address HOST:PORT     (a live job's metrics endpoint, from its banner)

Reads config.yaml (run.steps), metrics.parquet (rewritten atomically at every checkpoint and at
least every 30 s of steps, jobs.training.METRICS_EVERY_S: a running job's file is whole and at
most that far behind) and summary.json (written when the job closes). Prints the
state (running, finished, stopped), the version against the planned steps, the last and best
evaluation, the last step's training numbers, throughput and timing, staleness and drops,
restarts, and an ETA from the median wall time of the last steps.

`--address` reads the same numbers as they are now from the job's Prometheus endpoint
(`run.metrics_host:run.metrics_port`, cluster/metrics.py): for a job whose run directory is on
another machine (the head of a cluster); it knows no history, so no best evaluation or ETA.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from jobs.records import StepRecord, last_and_best_eval, read_records

ETA_WINDOW = 5
"""Steps whose median wall time predicts the rest."""


def run_state(records: list[StepRecord], summary: dict | None, planned: int, now: float) -> str:
    """'finished', 'stopped at version V' or 'running' (with the age of the last step)."""
    last = records[-1]
    if summary is not None and summary["version"] >= last.version:
        if last.version >= planned:
            return "finished"
        return f"stopped at version {last.version} (continue with: python -m jobs.train --resume RUN_DIR)"
    age = now - last.time
    return f"running (last step {age:.0f} s ago)" if age < 600 else \
        f"running or died: no step for {age / 60:.0f} min and no summary.json"


def status_lines(run_dir: Path, now: float | None = None) -> list[str]:
    """The report, one line per topic; ValueError naming what is missing when the directory holds
    no run (yet)."""
    from jobs.config import load_config
    from jobs.train import JobConfig

    if not (run_dir / "config.yaml").is_file():
        raise ValueError(f"{run_dir} is not a run directory: it has no config.yaml")
    config = load_config(JobConfig, run_dir / "config.yaml")
    if not (run_dir / "metrics.parquet").is_file():
        return [f"run        {run_dir}", "state      started, no learner step yet (warm start or start-up)"]
    records = read_records(run_dir / "metrics.parquet")
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    last = records[-1]
    warm_steps = records[0].version - 1
    planned = warm_steps + config.run.steps
    lines = [f"run        {run_dir} ({config.learner.algorithm.name} on {config.env.name}, model {config.model.path})",
             f"state      {run_state(records, summary, planned, time.time() if now is None else now)}",
             f"version    {last.version} of {planned} ({len(records)} learner steps recorded"
             + (f", {warm_steps} warm-start SFT steps before)" if warm_steps else ")")]
    evals = last_and_best_eval(records)
    if evals:
        latest, best = evals
        types = ", ".join(f"{name} {value:.2f}" for name, value in sorted((latest.eval_success_by_type or {}).items()))
        lines.append(f"eval       {latest.eval_success:.3f} at version {latest.version} (best {best.eval_success:.3f} "
                     f"at {best.version})" + (f"; {types}" if types else ""))
    else:
        lines.append("eval       none yet")
    train = "n/a" if last.train_success_rate is None else f"{last.train_success_rate:.2f}"
    errors = "n/a" if last.format_error_rate is None else f"{last.format_error_rate:.2f}"
    lines += [
        f"train      success {train}, format errors {errors} per turn; loss {last.loss:.4f}, reverse KL "
        f"{last.reverse_kl:.3f}, mismatch KL {last.mismatch_kl:.4f}",
        f"speed      {last.rollout_tokens_per_s:.0f} rollout tokens/s; step {last.wall_s:.1f} s "
        f"(learner {last.learner_step_s:.1f} s, waiting {last.learner_idle_s:.1f} s, sync {last.weight_sync_s:.1f} s)",
        f"staleness  mean {last.mean_staleness:.2f}, max {last.max_staleness}; dropped stale {last.dropped_stale} of "
        f"{last.buffer_put} samples put ({last.dropped_stale / max(last.buffer_put, 1):.0%})",
        f"restarts   rollout runs {last.rollout_failed_runs}, teacher {last.teacher_restarts}, "
        f"environments {last.env_restarts}, job recoveries {last.job_recoveries or 0}, agent programs failed "
        f"{last.agent_failures or 0}; skipped steps "
        f"{last.nonfinite_steps} non-finite, {last.empty_batches} empty",
    ]
    remaining = planned - last.version
    if remaining > 0:
        wall = statistics.median(r.wall_s for r in records[-ETA_WINDOW:])
        lines.append(f"eta        {remaining} steps x {wall:.1f} s = {remaining * wall / 60:.1f} min")
    return lines


def live_status_lines(address: str, timeout_s: float = 5.0) -> list[str]:
    """The report of a live job from its metrics endpoint; ValueError when it does not answer."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    url = address if "://" in address else f"http://{address}"
    url = url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            text = response.read().decode()
    except OSError as exc:
        raise ValueError(f"no metrics at {url} ({exc}): is the job running, with run.metrics_port set?") from None
    values: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values.setdefault(sample.name.removeprefix("apprentice_"), {})[tuple(sorted(sample.labels.items()))] = \
                sample.value
    if "learner_version" not in values:
        raise ValueError(f"{url} is not an Apprentice job's endpoint (no apprentice_learner_version)")

    def one(name: str) -> float:
        return next(iter(values.get(name, {0: float("nan")}).values()))

    def by(name: str, label: str) -> dict[str, float]:
        return {dict(key)[label]: value for key, value in values.get(name, {}).items() if label in dict(key)}

    evals = by("eval_success", "task_type")
    overall = evals.pop("overall", None)
    staleness_count = one("consumed_staleness_count")
    mean_staleness = one("consumed_staleness_sum") / staleness_count if staleness_count else float("nan")
    drops = ", ".join(f"{reason} {value:.0f}" for reason, value in sorted(by("buffer_dropped_total", "reason").items()))
    restarts = ", ".join(f"{c} {v:.0f}" for c, v in sorted(by("actor_restarts_total", "component").items()))
    return [
        f"job        {url}",
        f"version    {one('learner_version'):.0f}",
        "eval       " + ("none yet" if overall is None else f"{overall:.3f}"
                         + "".join(f"; {name} {value:.2f}" for name, value in sorted(evals.items()))),
        f"train      reverse KL {one('opd_reverse_kl'):.3f}, format errors {one('format_error_rate'):.2f} per turn, "
        f"mismatch KL {one('learner_mismatch_kl'):.4f}",
        f"speed      {one('rollout_tokens_per_s'):.0f} rollout tokens/s; learner step {one('learner_step_seconds'):.1f} s, "
        f"waiting {one('learner_idle_seconds'):.1f} s, sync {one('weight_sync_seconds'):.1f} s",
        f"staleness  mean {mean_staleness:.2f} over {staleness_count:.0f} samples consumed; buffer "
        f"{one('buffer_occupancy'):.0%} full; dropped: {drops or 'none'}",
        f"restarts   {restarts or 'none'}; job recoveries {one('job_recoveries_total'):.0f}",
    ]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    live = len(args) == 2 and args[0] == "--address"
    if not live and (len(args) != 1 or args[0].startswith("-")):
        print("usage: python -m jobs.status RUN_DIR | --address HOST:PORT", file=sys.stderr)
        return 2
    try:
        print("\n".join(live_status_lines(args[1]) if live else status_lines(Path(args[0]))))
    except ValueError as exc:
        print(f"jobs.status: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
