"""Learning check: train the embedded default and compare its eval success with the start,
a random policy and the expert, all on the same eval tasks.

1. `jobs.evaluate` of the initial student, of `policy=random` (a uniformly random valid tool
   call every turn) and of `policy=expert` (the bot), greedy, on the job's eval split and
   environment (its `run.eval_split`, `env`, `rollout.loop`);
2. `python -m jobs.train` with the job's config;
3. the same eval of the exported final policy.

Goals on the starter level (2 cores): start <= 0.05, end >= 0.8, end - random >= 0.4,
training within 15 minutes, learner idle <= 0.3. `eval_success_min` is the lowest of the run's
periodic evaluations (`run.eval_every`, `run.eval_tasks`): a run that lost its call format midway
and found it again ends as well as one that never lost it.

    python benchmarks/learning_opd.py [--config jobs/configs/babyai_opd_tiny.yaml] [--eval-tasks 100] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import yaml


def evaluate(job, model_path: str, policy: str, out: Path, num_tasks: int) -> dict:
    """`jobs.evaluate` with the job's environment, loop and eval split; returns the summary."""
    out.mkdir(parents=True, exist_ok=True)
    config = {"policy": policy, "model": {**job.model.model_dump(mode="json"), "path": model_path},
              "engine": job.rollout.engine, "env": job.env.model_dump(mode="json"),
              "loop": job.rollout.loop.model_dump(mode="json"),
              "sampling": {"temperature": 0.0, "max_new_tokens": job.rollout.sampling.max_new_tokens},
              "split": job.run.eval_split, "num_tasks": num_tasks, "num_threads": 2, "output_dir": str(out)}
    (out / "evaluate.yaml").write_text(yaml.safe_dump(config))
    subprocess.run([sys.executable, "-m", "jobs.evaluate", "--config", str(out / "evaluate.yaml")], check=True,
                   stdout=subprocess.DEVNULL)
    return json.loads((out / "results.json").read_text())["summary"]


def train(config: str, overrides: list[str]) -> None:
    """`python -m jobs.train`. A run stopped because no group carried a learning signal any more
    (jobs.train.NO_SIGNAL_EXIT: a collapsed format, say) exported its policy as at any end: a
    result of its arm, evaluated like the others; any other failure stops the benchmark."""
    from jobs.train import NO_SIGNAL_EXIT

    command = [sys.executable, "-m", "jobs.train", "--overwrite", "--config", config, *overrides]
    status = subprocess.run(command).returncode
    if status not in (0, NO_SIGNAL_EXIT):
        raise subprocess.CalledProcessError(status, command)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="jobs/configs/babyai_opd_tiny.yaml")
    parser.add_argument("--eval-tasks", type=int, default=100)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    from jobs.config import load_config
    from jobs.train import JobConfig

    job = load_config(JobConfig, args.config, args.overrides)
    run_dir = Path(job.run.dir)
    n = args.eval_tasks
    start = evaluate(job, job.model.path, "model", run_dir / "eval_start", n)
    random = evaluate(job, job.model.path, "random", run_dir / "eval_random", n)
    expert = evaluate(job, job.model.path, "expert", run_dir / "eval_expert", n)
    t0 = time.perf_counter()
    train(args.config, args.overrides)
    wall = time.perf_counter() - t0
    end = evaluate(job, str(run_dir / "hf"), "model", run_dir / "eval_end", n)
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    idle = sum(r["learner_idle_s"] for r in rows) / max(sum(r["wall_s"] for r in rows), 1e-9)
    print(f"{'task type':<22}{'start':>8}{'random':>8}{'expert':>8}{'end':>8}")
    for name in end:
        print(f"{name:<22}" + "".join(f"{s.get(name, {}).get('success_rate', 0):>8.3f}"
                                      for s in (start, random, expert, end)))
    evals = [(r["version"], r["eval_success"]) for r in rows if r["eval_success"] is not None]
    curve = " ".join(f"{version}:{success:.2f}" for version, success in evals)
    print(f"eval during training (version:success): {curve}")
    print(f"steps={len(rows)} learner_s={sum(r['learner_step_s'] for r in rows):.0f} "
          f"weight_sync_s={sum(r['weight_sync_s'] for r in rows):.1f} end format_error_rate="
          f"{end['overall']['format_error_rate']:.3f}")
    print(f"RESULT eval_success_start={start['overall']['success_rate']:.3f} "
          f"eval_success_end={end['overall']['success_rate']:.3f} "
          f"eval_success_random={random['overall']['success_rate']:.3f} "
          f"eval_success_expert={expert['overall']['success_rate']:.3f} "
          f"eval_success_min={min((s for _, s in evals), default=float('nan')):.3f} "
          f"wall_s={wall:.0f} learner_idle_frac={idle:.2f}")


if __name__ == "__main__":
    main()
