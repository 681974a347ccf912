"""Vanilla OPD vs TCOD-F2B vs TCOD-B2F from the same warm start, at equal wall clock, on the starter level.

1. One warm start (the config's `warm_start`), exported as a HF directory; every arm starts from it.
2. The expert's trajectories over the train split (`jobs.collect_expert`), for B2F.
3. Three `jobs.train` runs of `--budget-s` seconds each: opd (the config as it is), f2b and b2f
   (`learner.algorithm.name=tcod`, horizon k = 1 + ⌊n / 2⌋).
4. Per-turn-index reverse KL from each run's metrics.parquet (mean over its steps) and the
   slope KL(last two turn indices) / KL(first two); greedy eval of each final policy.
The seed's claim: the curriculum flattens the per-turn KL (errors stop compounding over turns).

    python benchmarks/tcod_vs_opd.py [--config jobs/configs/babyai_opd_tiny.yaml] [--budget-s 300]
                                     [--eval-tasks 100] [--out runs/tcod_vs_opd]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from learning_opd import evaluate  # benchmarks/ is on sys.path when run as a script


def run(module: str, args: list[str]) -> None:
    subprocess.run([sys.executable, "-m", module, *args], check=True)


def kl_by_turn(run_dir: Path) -> list[float]:
    """Mean over the run's steps of the reverse KL at each turn index (indices some step trained)."""
    sums: dict[int, list[float]] = {}
    for row in pq.read_table(run_dir / "metrics.parquet").to_pylist():
        for index, value in enumerate(row["reverse_kl_by_turn"] or []):
            if value is not None:
                sums.setdefault(index, []).append(value)
    return [sum(sums[i]) / len(sums[i]) for i in sorted(sums)]


def slope(values: list[float]) -> float:
    if len(values) < 4:
        return float("nan")
    first, last = sum(values[:2]) / 2, sum(values[-2:]) / 2
    return last / first if first else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="jobs/configs/babyai_opd_tiny.yaml")
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--eval-tasks", type=int, default=100)
    parser.add_argument("--out", default="runs/tcod_vs_opd")
    args = parser.parse_args()
    from jobs.config import load_config
    from jobs.train import JobConfig

    out = Path(args.out)
    base = load_config(JobConfig, args.config)
    warm = out / "warm"
    run("jobs.train", ["--overwrite", "--config", args.config, f"run.dir={warm}", "run.steps=1", "run.eval_every=0",
                       "warm_start.export=true"])
    env = [f"env.{key}={json.dumps(value)}" for key, value in base.env.model_dump(mode="json").items()]
    experts = out / "expert"
    run("jobs.collect_expert", [*env, f"max_turns={base.rollout.loop.max_turns}",
                                "num_tasks=4000", f"output_dir={experts}"])
    common = [f"model.path={warm / 'warm_start_hf'}", f"run.max_wall_s={args.budget_s}", "warm_start.num_episodes=0",
              "run.steps=100000"]
    arms = {"opd": [], "f2b": ["learner.algorithm.name=tcod", "learner.algorithm.tcod.mode=f2b"],
            "b2f": ["learner.algorithm.name=tcod", "learner.algorithm.tcod.mode=b2f",
                    f"learner.algorithm.tcod.expert_path={experts}"]}
    job = base.model_copy(update={"model": base.model.model_copy(update={"path": str(warm / "warm_start_hf")})})
    results, kls = {}, {}
    for arm, overrides in arms.items():
        run_dir = out / arm
        run("jobs.train", ["--overwrite", "--config", args.config, *common, f"run.dir={run_dir}", *overrides])
        results[arm] = evaluate(job, str(run_dir / "hf"), "model", run_dir / "eval_end", args.eval_tasks)
        kls[arm] = kl_by_turn(run_dir)
        print(f"{arm}: reverse KL by turn index " + " ".join(f"{v:.3f}" for v in kls[arm]), flush=True)
    print(f"{'task type':<22}" + "".join(f"{arm:>8}" for arm in results))
    for name in results["opd"]:
        print(f"{name:<22}" + "".join(f"{results[arm].get(name, {}).get('success_rate', 0):>8.3f}" for arm in results))
    print("RESULT " + " ".join(f"kl_slope_{arm}={slope(kls[arm]):.3f}" for arm in arms) + " "
          + " ".join(f"eval_{arm}={results[arm]['overall']['success_rate']:.3f}" for arm in arms)
          + f" budget_s={args.budget_s:.0f}")


if __name__ == "__main__":
    main()
