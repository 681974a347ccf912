"""Learning check: run `babyai_opd_tiny` and report eval success at start and end, with wall time.

Zero-shot eval of the initial tiny model, then `python -m jobs.train` on the embedded default,
then the same eval of the exported final policy (greedy, the study's eval50 tasks). Goal for
the tiny student with the oracle teacher on 2 CPU cores: at least 0.5 overall.

    python benchmarks/learning_opd.py [--config jobs/configs/babyai_opd_tiny.yaml] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq


def evaluate(model_path: str, out: Path, num_tasks: int, max_turns: int, max_new_tokens: int) -> dict:
    subprocess.run([sys.executable, "-m", "jobs.evaluate", f"model.path={model_path}", f"num_tasks={num_tasks}",
                    f"loop.max_turns={max_turns}", "loop.prompt.history_window=all", "num_threads=2",
                    f"sampling.max_new_tokens={max_new_tokens}", f"output_dir={out}"],
                   check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "results.json").read_text())["summary"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="jobs/configs/babyai_opd_tiny.yaml")
    parser.add_argument("--eval-tasks", type=int, default=50)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    from jobs.config import load_config
    from jobs.train import JobConfig

    config = load_config(JobConfig, args.config, args.overrides)
    run_dir = Path(config.run.dir)
    limits = (config.rollout.loop.max_turns, config.rollout.sampling.max_new_tokens)
    start = evaluate(config.model.path, run_dir / "eval_start", args.eval_tasks, *limits)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "jobs.train", "--config", args.config, *args.overrides], check=True)
    wall = time.perf_counter() - t0
    end = evaluate(str(run_dir / "hf"), run_dir / "eval_end", args.eval_tasks, *limits)
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    idle = sum(r["learner_idle_s"] for r in rows) / max(sum(r["wall_s"] for r in rows), 1e-9)
    learn = sum(r["learner_step_s"] for r in rows)
    sync = sum(r["weight_sync_s"] for r in rows)
    print(f"{'task type':<22}{'start':>8}{'end':>8}")
    for name in end:
        print(f"{name:<22}{start.get(name, {}).get('success_rate', 0):>8.3f}{end[name]['success_rate']:>8.3f}")
    print(f"steps={len(rows)} wall_s={wall:.0f} learner_s={learn:.0f} weight_sync_s={sync:.1f} "
          f"idle_frac={idle:.2f} final format_error_rate={rows[-1]['format_error_rate']:.2f}")
    print(f"RESULT eval_success_start={start['overall']['success_rate']:.3f} "
          f"eval_success_end={end['overall']['success_rate']:.3f} wall_s={wall:.0f} learner_idle_frac={idle:.2f}")


if __name__ == "__main__":
    main()
