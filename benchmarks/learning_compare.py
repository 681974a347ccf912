"""SFT-only vs OPD vs GRPO vs turn-level judge from the same warm start, at equal wall clock, on the starter level.

1. One warm start (the config's `warm_start`: SFT on the bot's demonstrations), exported as
   a HF directory; every arm starts from it.
2. Three `jobs.train` runs of `--budget-s` seconds each (`run.max_wall_s`), warm start off:
   - sft: more SFT on fresh bot demonstrations (the seeds' "SFT on teacher successes");
   - opd: on-policy distillation from the oracle teacher (the config as it is);
   - opd_sampled: the same with only the sampled-token reverse-KL term (no top-k term);
   - grpo: GRPO on outcome + format rewards, no teacher;
   - turn_judge: turn-level RL on 0.5·outcome + 0.5·judge, the oracle judge (babyai_turn_judge_tiny's
     settings: group size 1, k = 4 turns per episode), no teacher.
3. `jobs.evaluate` of each final policy (greedy, the same eval tasks).
Curves (eval success at the runs' eval steps) go to `<out>/curves.parquet`. The seeds expect
OPD > GRPO at equal compute.

    python benchmarks/learning_compare.py [--config jobs/configs/babyai_opd_tiny.yaml] [--budget-s 300]
                                          [--eval-tasks 100] [--out runs/learning_compare]
                                          [--arms sft,opd,opd_sampled,grpo,turn_judge]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from learning_opd import evaluate, train  # benchmarks/ is on sys.path when run as a script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="jobs/configs/babyai_opd_tiny.yaml")
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--eval-tasks", type=int, default=100)
    parser.add_argument("--out", default="runs/learning_compare")
    parser.add_argument("--arms", default="sft,opd,opd_sampled,grpo,turn_judge",
                        help="comma-separated subset of the arms, run in this order")
    args = parser.parse_args()
    from jobs.config import load_config
    from jobs.train import JobConfig

    out = Path(args.out)
    base = load_config(JobConfig, args.config)
    warm = out / "warm"
    train(args.config, [f"run.dir={warm}", "run.steps=1", "run.eval_every=0", "warm_start.export=true"])
    start_from = f"model.path={warm / 'warm_start_hf'}"
    budget = f"run.max_wall_s={args.budget_s}"
    arms = {
        # More demonstrations than the budget can use: the wall clock ends the SFT.
        "sft": ["warm_start.first_seed=600000000", "warm_start.num_episodes=4000", "warm_start.epochs=1",
                "run.steps=1"],
        "opd": ["warm_start.num_episodes=0", "run.steps=100000"],
        # OPD with the sampled-token reverse-KL term only (no forward KL to the teacher's top-k).
        "opd_sampled": ["warm_start.num_episodes=0", "run.steps=100000", "teacher.top_k=0",
                        "learner.algorithm.topk_kl_coef=0"],
        "grpo": ["warm_start.num_episodes=0", "run.steps=100000", "teacher=null", "learner.algorithm.name=grpo",
                 "learner.algorithm.topk_kl_coef=0", "rollout.group_size=8"],
        "turn_judge": ["warm_start.num_episodes=0", "run.steps=100000", "teacher=null", "judge.backend=oracle",
                       "learner.algorithm.name=turn_judge", "learner.algorithm.topk_kl_coef=0",
                       "rollout.group_size=1"],
    }
    unknown = set(args.arms.split(",")) - set(arms)
    if unknown:
        parser.error(f"unknown arms {sorted(unknown)}; known: {list(arms)}")
    arms = {arm: arms[arm] for arm in args.arms.split(",")}
    results, curves = {}, []
    for arm, overrides in arms.items():
        run_dir = out / arm
        train(args.config, [start_from, budget, f"run.dir={run_dir}", *overrides])
        job = base.model_copy(update={"model": base.model.model_copy(update={"path": str(warm / "warm_start_hf")})})
        results[arm] = evaluate(job, str(run_dir / "hf"), "model", run_dir / "eval_end", args.eval_tasks)
        for name in ("warm_start.parquet", "metrics.parquet"):
            if (run_dir / name).exists():
                for row in pq.read_table(run_dir / name).to_pylist():
                    if row["eval_success"] is not None:
                        curves.append({"arm": arm, "version": row["version"], "eval_success": row["eval_success"]})
    warm_eval = evaluate(base, str(warm / "warm_start_hf"), "model", warm / "eval", args.eval_tasks)
    pq.write_table(pa.Table.from_pylist(curves), out / "curves.parquet")
    print(f"{'task type':<22}{'warm':>11}" + "".join(f"{arm:>11}" for arm in results))
    for name in warm_eval:
        print(f"{name:<22}{warm_eval[name]['success_rate']:>11.3f}" +
              "".join(f"{results[arm].get(name, {}).get('success_rate', 0):>11.3f}" for arm in results))
    print(f"curves: {out / 'curves.parquet'}")
    print(f"RESULT eval_warm={warm_eval['overall']['success_rate']:.3f} "
          + " ".join(f"eval_{arm}={r['overall']['success_rate']:.3f}" for arm, r in results.items())
          + f" budget_s={args.budget_s:.0f}")


if __name__ == "__main__":
    main()
