"""Build a RetireOPD teacher: the student's model, trained with privileged context c+ on the environment's reward.

    python -m jobs.build_teacher --config jobs/configs/babyai_teacher_tiny.yaml [key.sub=value ...] [--dry-run]

The config is a training job (jobs.train's sections) whose rollout reads c+
(`rollout.loop.privileged`: skills from a skill bank, the environment's map) and whose
algorithm needs no teacher (GRPO on the environment's reward). `model` is the student's
architecture and initialisation. As in jobs.train, a student that starts from random weights
first clones the expert's demonstrations (`warm_start`), here rendered with c+. Then the
teacher is frozen: its weights are exported to `<run.dir>/hf` with `teacher.json` beside them
(envs.privileged's c+ as loaded, the environment and prompt config it was trained with, and
SR_T: its greedy success acting as a policy with c+ on `run.eval_split`, `run.eval_tasks`
tasks, measured by the rollout workers). With `run.export_best` (the shipped teacher configs set
it) the teacher is the better of the final policy and the best periodic evaluation's (the warm
start's included): GRPO on the environment's reward can lower what the warm start reached, and
SR_T is then that evaluation's success (chosen on the same tasks: biased up by the choice). A
RetireOPD job serves it with `teacher.backend=hf|vllm teacher.model.path=<run.dir>/hf` and the same c+ in
`teacher.privileged`; its preflight checks both against teacher.json and reads SR_T from it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from jobs.config import dump_config, load_config
from jobs.train import JobConfig, run_job


def check_teacher_job(config: JobConfig) -> None:
    """ValueError unless the job trains a teacher: c+ in the rollout, no teacher in the loss."""
    from learner.algorithms import ALGORITHMS

    if not config.rollout.loop.privileged.enabled:
        raise ValueError("rollout.loop.privileged is empty: a teacher is the student's model trained with privileged "
                         "context; set rollout.loop.privileged.skill_bank, .skills or .map")
    algorithm = config.learner.algorithm
    if ALGORITHMS[algorithm.name].uses_teacher(algorithm):
        raise ValueError(f"learner.algorithm.name={algorithm.name} learns from a teacher; the teacher is built on the "
                         f"environment's reward (grpo, turn_level, sft)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.build_teacher", description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="YAML file with JobConfig sections")
    parser.add_argument("--dry-run", action="store_true", help="print the resolved config and resource plan")
    parser.add_argument("overrides", nargs="*", help="key.sub=value")
    args = parser.parse_args(argv)
    try:
        config = load_config(JobConfig, args.config, args.overrides)
        check_teacher_job(config)
    except ValueError as exc:  # ConfigError included
        print(exc, file=sys.stderr)
        return 2
    if args.dry_run:
        print(dump_config(config))
        print(config.cluster.plan.describe())
        return 0
    from jobs.training import BEST_HF, read_best
    from teacher.privileged import TEACHER_MANIFEST, teacher_manifest

    out = Path(config.run.dir) / "hf"
    privileged = config.rollout.loop.privileged

    def measure(run) -> None:
        run.pool.publish_weights(run.learner.publish(), run.version)  # the exported weights, whatever publish_every
        success, by_type = run.evaluate()
        version, best = run.version, read_best(run.dir)
        if best["eval_success"] > success:  # run.export_best: an earlier policy did better on the same tasks
            print(f"the final policy's {success:.3f} is below version {best['version']}'s {best['eval_success']:.3f}: "
                  f"that one is the teacher", flush=True)
            shutil.rmtree(out)
            shutil.copytree(run.dir / BEST_HF, out)
            version, success, by_type = best["version"], best["eval_success"], best["eval_success_by_type"]
        manifest = {**teacher_manifest(privileged, config.env, config.rollout.loop.prompt),
                    "teacher_success": success, "teacher_success_by_type": by_type,
                    "eval_split": config.run.eval_split, "eval_tasks": config.run.eval_tasks,
                    "version": version, "student_model": config.model.model_dump(mode="json")}
        (out / TEACHER_MANIFEST).write_text(json.dumps(manifest, indent=2))
        print(f"teacher success with privileged context (SR_T) on {config.run.eval_split}: {success:.3f} "
              f"{json.dumps(by_type)}", flush=True)

    status = run_job(config, finish=measure)
    if status == 0:
        print(f"teacher written to {out}; serve it in a RetireOPD job with\n  teacher.backend=hf "
              f"teacher.model.path={out} 'teacher.privileged={json.dumps(privileged.model_dump(mode='json'))}'",
              flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
