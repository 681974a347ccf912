"""OPD from a teacher with the student's tokenizer vs the same teacher behind another tokenizer.

1. Two teachers trained the same way (the config's warm start: SFT on the bot's demonstrations,
   then exported): `same` is `tiny:tiny` (the student's tokenizer, 1,024 tokens), `cross` is
   `tiny:tiny384` (the same shape and training, a 384-token tokenizer: other token boundaries).
2. One short student warm start (`--student-episodes` demonstrations, one epoch: 32 SFT steps by
   default, stopped early so that OPD has something to teach; 128 steps already made a student as
   good as the teachers), exported; both arms start from it.
3. Two `jobs.train` OPD runs of `--steps` learner steps each (equal steps), hf teacher, sampled-token
   reverse KL only (top-k cannot cross vocabularies): `same`, and `cross` with
   `teacher.cross_tokenizer=true`. Greedy eval of each final policy, of the start and of each teacher.
4. Scoring cost, in this process on the same 64 demonstration episodes: the same teacher's
   ModelTeacher vs the cross teacher through CrossTokenizerBackend (`scoring_overhead`), and the
   same teacher through the cross path with its own tokenizer (`cross_path_overhead`: what the
   per-turn requests and the byte mapping cost, apart from the other tokenizer's longer sequences).

    python benchmarks/cross_tokenizer.py [--config jobs/configs/babyai_opd_tiny.yaml] [--steps 30]
                                         [--student-episodes 64] [--lr 2e-4] [--eval-tasks 100]
                                         [--out runs/cross_tokenizer] [--keep-teachers]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from learning_opd import evaluate, train  # benchmarks/ is on sys.path when run as a script


def last_format_errors(run_dir: Path, num_steps: int = 5) -> float:
    """Mean sampled format-error rate of the run's last steps that finished episodes (a student
    that has not learned the format yet fails every task: this moves first)."""
    import pyarrow.parquet as pq

    rates = [r["format_error_rate"] for r in pq.read_table(run_dir / "metrics.parquet").to_pylist()
             if r["format_error_rate"] is not None][-num_steps:]
    return sum(rates) / len(rates) if rates else float("nan")


def scoring_times(job, same_dir: Path, cross_dir: Path, num_episodes: int = 64) -> dict[str, float]:
    """Seconds to score the same demonstration episodes three ways (module docstring, 4)."""
    from jobs.warm_start import demonstrations
    from models.loading import ModelConfig, load_model, load_tokenizer
    from teacher.backends import HFTeacherBackend
    from teacher.cross_tokenizer import CrossTokenizerBackend
    from teacher.service import ModelTeacher

    student = load_tokenizer(job.model)
    ws = job.warm_start.model_copy(update={"num_episodes": num_episodes, "first_seed": 700_000_000})
    episodes = demonstrations(ws, job.rollout, job.env, student)
    same_tok, cross_tok = load_tokenizer(ModelConfig(path=str(same_dir))), load_tokenizer(ModelConfig(path=str(cross_dir)))
    same = HFTeacherBackend(load_model(ModelConfig(path=str(same_dir))), same_tok.pad_token_id)
    cross = HFTeacherBackend(load_model(ModelConfig(path=str(cross_dir))), cross_tok.pad_token_id)
    scorers = {"same": ModelTeacher(same), "cross": ModelTeacher(CrossTokenizerBackend(cross, student, cross_tok)),
               "cross_path": ModelTeacher(CrossTokenizerBackend(same, student, same_tok))}
    times = {}
    for name, scorer in scorers.items():
        scorer.score_trajectories(episodes[:4])  # warm up
        start = time.perf_counter()
        for i in range(0, len(episodes), 16):
            scorer.score_trajectories(episodes[i:i + 16])
        times[name] = time.perf_counter() - start
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="jobs/configs/babyai_opd_tiny.yaml")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--student-episodes", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-4,
                        help="the arms' learner.lr: Adam's step is lr whatever the gradient's size, and the sampled-"
                             "token term of a teacher close to the student is mostly noise (measured: at the config's "
                             "1e-3 both arms' students collapsed to format errors 1.00 within 4 steps)")
    parser.add_argument("--keep-teachers", action="store_true",
                        help="reuse the teachers an earlier run with the same --out trained")
    parser.add_argument("--eval-tasks", type=int, default=100)
    parser.add_argument("--out", default="runs/cross_tokenizer")
    args = parser.parse_args()
    import torch

    from jobs.config import load_config
    from jobs.train import JobConfig

    torch.set_num_threads(1)
    out = Path(args.out)
    base = load_config(JobConfig, args.config)
    teachers = {"same": "tiny:tiny", "cross": "tiny:tiny384"}
    teacher_dirs = {arm: out / f"teacher_{arm}" / "warm_start_hf" for arm in teachers}
    for arm, model in teachers.items():  # the config's warm start, exported: a teacher
        if (teacher_dirs[arm] / "config.json").is_file() and args.keep_teachers:
            continue
        train(args.config, [f"model.path={model}", f"run.dir={out / ('teacher_' + arm)}", "run.steps=1",
                            "run.eval_every=0", "warm_start.export=true"])
    warm = out / "student_warm"
    train(args.config, [f"run.dir={warm}", "run.steps=1", "run.eval_every=0", "warm_start.export=true",
                        f"warm_start.num_episodes={args.student_episodes}", "warm_start.epochs=1"])
    job = base.model_copy(update={"model": base.model.model_copy(update={"path": str(warm / "warm_start_hf")})})
    common = [f"model.path={warm / 'warm_start_hf'}", "warm_start.num_episodes=0", f"run.steps={args.steps}",
              "teacher.backend=hf", "teacher.top_k=0", "learner.algorithm.topk_kl_coef=0", f"learner.lr={args.lr}"]
    results, wall = {}, {}
    for arm in teachers:
        run_dir = out / arm
        start = time.perf_counter()
        train(args.config, [*common, f"teacher.model.path={teacher_dirs[arm]}", f"run.dir={run_dir}",
                            f"teacher.cross_tokenizer={str(arm == 'cross').lower()}"])
        wall[arm] = time.perf_counter() - start
        results[arm] = evaluate(job, str(run_dir / "hf"), "model", run_dir / "eval_end", args.eval_tasks)
    start_eval = evaluate(job, str(warm / "warm_start_hf"), "model", warm / "eval", args.eval_tasks)
    teacher_evals = {arm: evaluate(job, str(teacher_dirs[arm]), "model", out / f"teacher_{arm}" / "eval",
                                   args.eval_tasks) for arm in teachers}
    times = scoring_times(base, teacher_dirs["same"], teacher_dirs["cross"])
    print(f"{'task type':<22}{'start':>9}{'same':>9}{'cross':>9}{'T same':>9}{'T cross':>9}")
    for name in start_eval:
        row = [start_eval, results["same"], results["cross"], teacher_evals["same"], teacher_evals["cross"]]
        print(f"{name:<22}" + "".join(f"{r.get(name, {}).get('success_rate', 0):>9.3f}" for r in row))
    print("scoring 64 episodes: " + ", ".join(f"{k} {v:.2f} s" for k, v in times.items())
          + "; job wall clock: " + ", ".join(f"{k} {v:.0f} s" for k, v in wall.items()))
    fmt = {arm: last_format_errors(out / arm) for arm in teachers}
    print("format errors per turn, mean of the last 5 steps: " + ", ".join(f"{k} {v:.2f}" for k, v in fmt.items()))
    same, cross = results["same"]["overall"]["success_rate"], results["cross"]["overall"]["success_rate"]
    print(f"RESULT cross_over_same_success={cross / same if same else float('nan'):.3f} "
          f"scoring_overhead={times['cross'] / times['same']:.2f} cross_path_overhead={times['cross_path'] / times['same']:.2f} "
          f"same_success={same:.3f} cross_success={cross:.3f} start_success={start_eval['overall']['success_rate']:.3f} "
          f"teacher_same={teacher_evals['same']['overall']['success_rate']:.3f} "
          f"teacher_cross={teacher_evals['cross']['overall']['success_rate']:.3f} same_fmt_err={fmt['same']:.3f} "
          f"cross_fmt_err={fmt['cross']:.3f} steps={args.steps}")


if __name__ == "__main__":
    main()
