"""RetireOPD vs never retiring vs GRPO alone, from the same warm start, at equal wall clock.

1. One warm start (the config's `warm_start`), exported as a HF directory; every arm starts from it
   (`<out>/warm` of an earlier run with the same --out is reused).
2. Three `jobs.train` runs of `--budget-s` seconds each:
   - retire: the config as it is (`retire_opd`: GRPO + λ·OPD, the retirement rule at each eval);
   - never: the same joint loss, the teacher never retires (`joint`);
   - grpo: GRPO alone, no teacher.
   With `--teacher DIR` (a teacher jobs.build_teacher built) the retire and never arms score with
   it, with the privileged context its teacher.json records, instead of the config's teacher.
3. Greedy eval of each final policy; from the retire arm's metrics.parquet, the version at which
   the teacher retired and the rollout tokens/s before and after (after retirement the teacher's
   bundle runs an extra rollout worker).

    python benchmarks/retire.py [--config jobs/configs/babyai_retire_tiny.yaml] [--budget-s 300]
                                [--eval-tasks 100] [--out runs/retire] [--teacher runs/babyai_teacher_tiny/hf]
                                [key.sub=value ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow.parquet as pq

from learning_opd import evaluate, train  # benchmarks/ is on sys.path when run as a script


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="jobs/configs/babyai_retire_tiny.yaml")
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--eval-tasks", type=int, default=100)
    parser.add_argument("--out", default="runs/retire")
    parser.add_argument("--teacher", help="a built teacher's HF directory (with teacher.json)")
    parser.add_argument("overrides", nargs="*", help="key.sub=value for every arm (e.g. run.eval_every=2: the rule "
                                                     "sees more evaluations within the budget)")
    args = parser.parse_args()
    from jobs.config import load_config
    from jobs.train import JobConfig
    from learner.algorithms import switch_algorithm

    out = Path(args.out)
    base = load_config(JobConfig, args.config, args.overrides)
    warm = out / "warm"
    if (warm / "warm_start_hf").exists():  # a previous run's warm start, in the same --out
        print(f"reusing the warm start in {warm}")
    else:
        train(args.config, [f"run.dir={warm}", "run.steps=1", "run.eval_every=0", "warm_start.export=true"])
    common = [f"model.path={warm / 'warm_start_hf'}", f"run.max_wall_s={args.budget_s}", "warm_start.num_episodes=0",
              "run.steps=100000", *args.overrides]
    teacher = []
    if args.teacher:
        from teacher.privileged import TEACHER_MANIFEST

        manifest = json.loads((Path(args.teacher) / TEACHER_MANIFEST).read_text())
        privileged = {"skills": manifest["skills"], "max_skills": manifest["max_skills"], "map": manifest["map"]}
        teacher = ["teacher.backend=hf", f"teacher.model.path={args.teacher}",
                   f"teacher.privileged={json.dumps(privileged)}"]
        print(f"teacher: {args.teacher}, SR_T {manifest['teacher_success']:.3f} on {manifest['eval_split']}")
    def algorithm(name: str, **knobs) -> str:  # the config's section as another algorithm's
        return f"learner.algorithm={json.dumps(switch_algorithm(base.learner.algorithm, name, **knobs).model_dump())}"

    arms = {"retire": teacher, "never": [algorithm("joint"), *teacher],
            "grpo": [algorithm("grpo", topk_kl_coef=0.0), "teacher=null"]}
    job = base.model_copy(update={"model": base.model.model_copy(update={"path": str(warm / "warm_start_hf")})})
    results = {}
    for arm, overrides in arms.items():
        run_dir = out / arm
        train(args.config, [*common, f"run.dir={run_dir}", *overrides])
        results[arm] = evaluate(job, str(run_dir / "hf"), "model", run_dir / "eval_end", args.eval_tasks)
    rows = pq.read_table(out / "retire" / "metrics.parquet").to_pylist()
    retired = [r["version"] for r in rows if r["teacher_stopped"]]
    before = mean([r["rollout_tokens_per_s"] for r in rows if not r["teacher_stopped"]])
    after = mean([r["rollout_tokens_per_s"] for r in rows if r["teacher_stopped"]])
    curve = " ".join(f"{r['version']}:{r['eval_success']:.2f}" for r in rows if r["eval_success"] is not None)
    print(f"retire arm eval during training (version:success): {curve}")
    print(f"{'task type':<22}" + "".join(f"{arm:>8}" for arm in results))
    for name in results["retire"]:
        print(f"{name:<22}" + "".join(f"{results[arm].get(name, {}).get('success_rate', 0):>8.3f}" for arm in results))
    print(f"RESULT retired_at={retired[0] - 1 if retired else 'never'} "
          + " ".join(f"eval_{arm}={r['overall']['success_rate']:.3f}" for arm, r in results.items())
          + f" rollout_tokens_per_s_before={before:.1f} rollout_tokens_per_s_after={after:.1f}"
          + f" budget_s={args.budget_s:.0f}")


if __name__ == "__main__":
    main()
