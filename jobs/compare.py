"""Compare training arms over seeds, with 95% confidence intervals a researcher can quote.

    python -m jobs.compare --config jobs/configs/babyai_opd_tiny.yaml \
        --arm opd= --arm "grpo=learner.algorithm={name: grpo} teacher=null rollout.group_size=8" \
        --baseline grpo --seeds 5 --steps 20 --eval-tasks 200 [--out runs/compare] [--warm KEY=VALUE ...]
        [--set KEY=VALUE ...]

`--set` overrides apply to the warm start and every arm (the level, say); `--warm` ones to the
warm start only. Arms may change the algorithm, the prompt, the rollout, anything but the
environment: every run is evaluated on the same tasks, with its own job's prompt and loop.

1. One warm start (the config's `warm_start`, `--warm` overrides to stop it early), exported as a
   HF directory: every run starts from the same weights, whose own success is measured on the
   same evaluation tasks (the reference line of the report).
2. Arms x seeds runs of `jobs.train` from it: `--steps N` learner steps each (equal steps) or
   `--wall-s S` seconds each (equal wall clock); seed s sets the rollout's sampling seed and the
   learner's seed (the task stream is the same for every run). Each run, and then its greedy
   evaluation on the first `--eval-tasks` tasks of the eval split (the same fixed tasks
   for every run), is one Ray task reserving the run's CPUs and GPUs: on a cluster, runs go in
   parallel where their resources fit; on 2 cores they queue. A run starts its own embedded Ray
   node on the machine its task holds.
3. Per arm: mean eval success over seeds ± the 95% CI (Student's t over the seeds' successes),
   overall and per task type; per arm, the paired difference with the baseline (seed s against
   seed s: the same warm start, the same evaluation tasks) ± its CI; learning curves (the runs'
   own evaluations, `run.eval_every`) with their 95% bands in `curves.png`; each arm's run wall
   clock and share of samples dropped stale; for arms with a teacher, the slope of the per-turn
   reverse KL over turn index (document 003's flatness, paired with the baseline where it has one
   too), the trained tokens the teacher scored, and the version where a schedule stopped the
   teacher (RetireOPD); `compare.md`, `runs.parquet` (one row per run and evaluation task) and
   one RESULT line.

A finished run is not run again: each run writes its result beside it
(`eval_compare/compare_result.json`) with a key of what it depends on (the config file's text,
the run's own overrides, budget and seed, its evaluation, the warm start's weights). The same
command after a crash, or with an arm or seeds added, runs only what is missing; a run whose
inputs changed is run again. The code is not part of the key: after a change to the code a run
depends on, point `--out` elsewhere (the warm start can be copied into it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
"""The 97.5% quantile of Student's t with 1..30 degrees of freedom."""


def t975(df: int) -> float:
    """Student's t 97.5% quantile; beyond the table, the next tabulated value down (conservative)."""
    if df < 1:
        raise ValueError(f"a confidence interval needs at least 2 values (df >= 1), got df={df}")
    return T975[df - 1] if df <= 30 else 2.000 if df <= 60 else 1.980 if df <= 120 else 1.960


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% confidence interval (t over n - 1 degrees of freedom;
    NaN for a single value: one run says nothing about run-to-run spread)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, t975(n - 1) * sd / math.sqrt(n)


def paired_difference(arm: dict[int, float], baseline: dict[int, float]) -> tuple[float, float]:
    """Mean of arm - baseline over the seeds both have, ± its 95% CI."""
    seeds = sorted(set(arm) & set(baseline))
    return mean_ci([arm[s] - baseline[s] for s in seeds])


def parse_arm(text: str) -> tuple[str, list[str]]:
    """`name=override override ...` (overrides split like a shell line; empty: the config as it is)."""
    import shlex

    name, sep, rest = text.partition("=")
    if not sep or not name.isidentifier():
        raise ValueError(f"--arm {text!r}: expected NAME=OVERRIDES (NAME a word, OVERRIDES possibly empty)")
    return name, shlex.split(rest)


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # an embedded node of its own


def evaluate_model(model_dir: str, eval_config: dict, out: Path) -> list[dict]:
    """Greedy `jobs.evaluate` of the model in `model_dir`: one row per task (seed, type, success)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "evaluate.json").write_text(json.dumps({**eval_config, "model": {**eval_config["model"], "path": model_dir},
                                                   "output_dir": str(out)}))
    with open(out / "evaluate.log", "w") as log:
        subprocess.run([sys.executable, "-m", "jobs.evaluate", "--config", str(out / "evaluate.json")], check=True,
                       env=_clean_env(), stdout=log, stderr=subprocess.STDOUT)
    return [{"seed": e["seed"], "task_type": e["task_type"], "success": bool(e["success"])}
            for e in pq.read_table(out / "episodes.parquet").to_pylist()]


def weights_identity(model_dir: Path) -> str:
    """A fingerprint of a HF directory's weights: each safetensors file's name, size and first and
    last MiB (a change of weights changes them; hashing every byte of an 8B model would take a
    minute)."""
    digest = hashlib.sha256()
    for path in sorted(model_dir.glob("*.safetensors")):
        size = path.stat().st_size
        digest.update(f"{path.name}:{size}".encode())
        with path.open("rb") as f:
            digest.update(f.read(1 << 20))
            f.seek(max(0, size - (1 << 20)))
            digest.update(f.read(1 << 20))
    return digest.hexdigest()


def run_key(config_text: str, overrides: list[str], eval_config: dict, warm_weights: str) -> str:
    """What a run's result depends on, as one string: the run is reused only under the same key."""
    return hashlib.sha256(json.dumps([config_text, overrides, eval_config, warm_weights], sort_keys=True)
                          .encode()).hexdigest()


def finished(result_dir: Path, key: str) -> dict | None:
    """The result a run (or an evaluation) left in `result_dir` under `key`; None: none, or another key's."""
    path = result_dir / "compare_result.json"
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    return saved["result"] if saved["key"] == key else None


def _save(result_dir: Path, key: str, result) -> None:
    from cluster.files import write_atomic

    text = json.dumps({"key": key, "result": result})
    result_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(result_dir / "compare_result.json", lambda tmp: tmp.write_text(text))


def run_arm_seed(config: str, overrides: list[str], run_dir: str, eval_config: dict, key: str) -> dict:
    """One run and its evaluation (the body of a Ray task): the per-task results and the curve,
    also saved under `key` (`finished`)."""
    from jobs.train import NO_SIGNAL_EXIT

    out = Path(run_dir) / "eval_compare"
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    command = [sys.executable, "-m", "jobs.train", "--overwrite", "--config", config, *overrides, f"run.dir={run_dir}",
               "cluster.address=null", "run.metrics_port=null"]
    with open(out / "train.log", "w") as log:  # beside the run, not in the comparison's console
        status = subprocess.run(command, env=_clean_env(), stdout=log, stderr=subprocess.STDOUT).returncode
    # A run that stopped because no group carried a signal any more (a collapsed format, say)
    # is a result of its arm: its exported policy is evaluated like any other.
    if status not in (0, NO_SIGNAL_EXIT):
        raise subprocess.CalledProcessError(status, command)
    train_s = time.monotonic() - start
    tasks = evaluate_model(str(Path(run_dir) / "hf"), eval_config, out)
    metrics = Path(run_dir) / "metrics.parquet"
    rows = pq.read_table(metrics).to_pylist() if metrics.is_file() else []
    result = {"tasks": tasks,
              "curve": [(r["version"], r["eval_success"]) for r in rows if r["eval_success"] is not None],
              "steps": len(rows), "train_s": train_s, "no_signal": status == NO_SIGNAL_EXIT,
              "stale_frac": rows[-1]["dropped_stale"] / max(rows[-1]["buffer_put"], 1) if rows else 0.0,
              **teacher_facts(rows, has_teacher(Path(run_dir) / "config.yaml"))}
    _save(out, key, result)
    return result


def evaluate_saved(model_dir: str, eval_config: dict, out: Path, key: str) -> list[dict]:
    """`evaluate_model`, its rows also saved under `key` (`finished`)."""
    tasks = evaluate_model(model_dir, eval_config, out)
    _save(out, key, tasks)
    return tasks


def has_teacher(config_path: Path) -> bool:
    import yaml

    config = yaml.safe_load(config_path.read_text())
    return config.get("teacher") is not None or bool(config.get("teacher_routes"))


def kl_slope(rows: list[dict]) -> float | None:
    """Least-squares slope of the run's per-turn reverse KL (each turn index's mean over the steps
    that trained a token there) against the turn index; None with fewer than two indices."""
    by_turn: dict[int, list[float]] = {}
    for row in rows:
        for index, kl in enumerate(row["reverse_kl_by_turn"] or []):
            if kl is not None:
                by_turn.setdefault(index, []).append(kl)
    if len(by_turn) < 2:
        return None
    xs = sorted(by_turn)
    ys = [sum(by_turn[x]) / len(by_turn[x]) for x in xs]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def teacher_facts(rows: list[dict], teacher: bool) -> dict:
    """kl_slope, the trained tokens the teacher scored (its steps before any stop) and the version
    where a schedule stopped it (None: never); all None without a teacher."""
    if not teacher:
        return {"kl_slope": None, "teacher_tokens": None, "stopped_at": None}
    stopped = [r["version"] for r in rows if r.get("teacher_stopped")]
    return {"kl_slope": kl_slope(rows), "stopped_at": stopped[0] if stopped else None,
            "teacher_tokens": sum(r["num_loss_tokens"] for r in rows if not r.get("teacher_stopped"))}


def evaluation_config(job, num_tasks: int) -> dict:
    """jobs.evaluate's config for the job's environment, loop and eval split (greedy)."""
    return {"policy": "model", "model": job.model.model_dump(mode="json"), "engine": job.rollout.engine,
            "env": job.env.model_dump(mode="json"), "loop": job.rollout.loop.model_dump(mode="json"),
            "sampling": {"temperature": 0.0, "max_new_tokens": job.rollout.sampling.max_new_tokens},
            "split": job.run.eval_split, "num_tasks": num_tasks, "num_threads": 1}


def summarize(results: dict[tuple[str, int], dict], baseline: str) -> dict:
    """Per arm: success per seed, mean ± CI overall and per task type, and the paired difference
    with `baseline` (the statistics of the module docstring)."""
    arms = sorted({arm for arm, _ in results}, key=lambda a: (a != baseline, a))
    per_seed = {arm: {seed: sum(t["success"] for t in r["tasks"]) / len(r["tasks"])
                      for (a, seed), r in results.items() if a == arm} for arm in arms}
    types = sorted({t["task_type"] for r in results.values() for t in r["tasks"]})
    summary = {}
    for arm in arms:
        by_type = {}
        for task_type in types:
            rates = [sum(t["success"] for t in r["tasks"] if t["task_type"] == task_type)
                     / max(1, sum(t["task_type"] == task_type for t in r["tasks"]))
                     for (a, _), r in results.items() if a == arm]
            by_type[task_type] = mean_ci(rates)
        runs = [r for (a, _), r in results.items() if a == arm]
        summary[arm] = {"per_seed": per_seed[arm], "overall": mean_ci(list(per_seed[arm].values())),
                        "by_type": by_type, "train_s": mean_ci([r["train_s"] for r in runs]),
                        "stale_frac": mean_ci([r["stale_frac"] for r in runs]),
                        "vs_baseline": None if arm == baseline else paired_difference(per_seed[arm], per_seed[baseline])}
        slopes = {seed: r["kl_slope"] for (a, seed), r in results.items() if a == arm and r.get("kl_slope") is not None}
        base_slopes = {seed: r["kl_slope"] for (a, seed), r in results.items()
                       if a == baseline and r.get("kl_slope") is not None}
        stopped = [r.get("stopped_at") for r in runs]
        tokens = [r["teacher_tokens"] for r in runs if r.get("teacher_tokens") is not None]
        summary[arm].update({
            "kl_slope": mean_ci(list(slopes.values())) if slopes else None,
            "kl_slope_vs_baseline": paired_difference(slopes, base_slopes)
            if arm != baseline and set(slopes) & set(base_slopes) else None,
            "teacher_tokens": mean_ci(tokens) if tokens else None,
            "no_signal": (sum(r.get("no_signal", False) for r in runs), len(runs)),
            "teacher_stopped": (sum(v is not None for v in stopped), len(stopped),
                                mean_ci([v for v in stopped if v is not None])
                                if any(v is not None for v in stopped) else None)})
    return summary


def _pm(value: tuple[float, float]) -> str:
    mean, half = value
    return f"{mean:.3f} ± {half:.3f}" if not math.isnan(half) else f"{mean:.3f} (1 seed: no CI)"


def report(summary: dict, baseline: str, header: str) -> str:
    """The comparison as a Markdown table: overall and per task type, and the paired differences."""
    arms = list(summary)
    types = list(next(iter(summary.values()))["by_type"])
    lines = [header, "", "| | " + " | ".join(arms) + " |", "|---" * (len(arms) + 1) + "|",
             "| overall | " + " | ".join(_pm(summary[a]["overall"]) for a in arms) + " |"]
    lines += [f"| {t} | " + " | ".join(_pm(summary[a]["by_type"][t]) for a in arms) + " |" for t in types]
    lines += ["| run wall clock (s) | " + " | ".join(_pm(summary[a]["train_s"]) for a in arms) + " |",
              "| samples dropped stale / put | " + " | ".join(_pm(summary[a]["stale_frac"]) for a in arms) + " |"]

    def optional(key: str, label: str, show) -> None:
        if any(summary[a].get(key) is not None for a in arms):
            lines.append(f"| {label} | " + " | ".join("-" if summary[a].get(key) is None else show(summary[a][key])
                                                     for a in arms) + " |")

    optional("kl_slope", "per-turn reverse KL slope (per turn index)", _pm)
    optional("teacher_tokens", "trained tokens the teacher scored", lambda v: f"{v[0]:.0f} ± {v[1]:.0f}")
    if any(summary[a]["teacher_stopped"][0] for a in arms):
        lines.append("| teacher stopped by the schedule | " + " | ".join(
            f"{k}/{n} seeds" + ("" if at is None else f", at version {_pm(at)}")
            for k, n, at in (summary[a]["teacher_stopped"] for a in arms)) + " |")
    if any(summary[a]["no_signal"][0] for a in arms):
        lines.append("| runs stopped early: no group carried a signal | " + " | ".join(
            "{}/{} seeds".format(*summary[a]["no_signal"]) for a in arms) + " |")
    lines += ["", f"Paired difference with `{baseline}` (seed against seed), mean ± 95% CI:", ""]
    for arm in arms[1:]:
        mean, half = summary[arm]["vs_baseline"]
        verdict = "" if math.isnan(half) else (" (above)" if mean - half > 0 else " (below)" if mean + half < 0
                                                else " (the CI holds 0: no difference shown)")
        lines.append(f"- {arm} - {baseline}: {mean:+.3f} ± {half:.3f}{verdict}")
        if summary[arm].get("kl_slope_vs_baseline") is not None:
            mean, half = summary[arm]["kl_slope_vs_baseline"]
            lines.append(f"  per-turn KL slope, {arm} - {baseline}: {mean:+.4f} ± {half:.4f}")
    return "\n".join(lines) + "\n"


def plot_curves(results: dict[tuple[str, int], dict], path: Path) -> None:
    """Eval success against learner version per arm: the mean over seeds and its 95% band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm in sorted({a for a, _ in results}):
        by_version: dict[int, list[float]] = {}
        for (a, _), r in results.items():
            for version, success in r["curve"] if a == arm else ():
                by_version.setdefault(version, []).append(success)
        versions = sorted(v for v, s in by_version.items() if len(s) >= 2)
        if not versions:
            continue
        stats = [mean_ci(by_version[v]) for v in versions]
        means = [m for m, _ in stats]
        ax.plot(versions, means, marker="o", label=arm)
        ax.fill_between(versions, [m - h for m, h in stats], [m + h for m, h in stats], alpha=0.2)
    ax.set_xlabel("learner version")
    ax.set_ylabel("eval success (run's own evaluations)")
    ax.set_ylim(0, 1)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="jobs/configs/babyai_opd_tiny.yaml")
    parser.add_argument("--arm", action="append", default=[], help="NAME=OVERRIDES (repeat; at least two)")
    parser.add_argument("--baseline", help="the arm the others are compared with (default: the first)")
    parser.add_argument("--seeds", type=int, default=5)
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--steps", type=int, help="learner steps per run (equal steps)")
    budget.add_argument("--wall-s", type=float, help="seconds per run (equal wall clock)")
    parser.add_argument("--eval-tasks", type=int, default=200)
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE for the warm start and every arm "
                                                                   "(e.g. the level: env.num_distractors=1)")
    parser.add_argument("--warm", action="append", default=[], help="KEY=VALUE for the shared warm start only")
    parser.add_argument("--out", default="runs/compare")
    parser.add_argument("--address", help="a Ray cluster to run on (default: $RAY_ADDRESS, else this machine)")
    return parser.parse_args(argv)


def _check(args: argparse.Namespace) -> tuple[dict[str, list[str]], str, dict[str, object], object]:
    """The arms, the baseline, each arm's job config and the warm start's, every one validated
    before any run. Each run is evaluated with its own job's prompt and loop, so the arms and the
    warm start must share one environment (the same tasks); one that changes it is refused."""
    from jobs.config import ConfigError, load_config
    from jobs.train import JobConfig

    arms = dict(parse_arm(text) for text in args.arm)
    if len(arms) < 2 or len(arms) != len(args.arm):
        raise ValueError(f"--arm: give at least two arms with distinct names, got {args.arm}")
    baseline = args.baseline or next(iter(arms))
    if baseline not in arms:
        raise ValueError(f"--baseline {baseline!r} is not an arm ({list(arms)})")
    if args.seeds < 2 or args.eval_tasks < 1:
        raise ValueError("--seeds must be >= 2 (a CI needs two runs) and --eval-tasks >= 1")
    try:
        env = load_config(JobConfig, args.config, args.set).env
    except ConfigError as exc:
        raise ValueError(f"--set: {exc}") from None
    jobs = {}
    for name, overrides in {**arms, "--warm": args.warm}.items():
        try:
            jobs[name] = load_config(JobConfig, args.config, [*args.set, *overrides])
        except ConfigError as exc:
            raise ValueError(f"arm {name}: {exc}" if name in arms else f"--warm: {exc}") from None
    for name, job in jobs.items():
        if job.env != env:
            fields = {k: v for k, v in job.env.model_dump().items() if env.model_dump().get(k) != v}
            raise ValueError(f"{'arm ' + name if name in arms else name} changes the environment ({fields}): "
                             f"every run is evaluated on the same tasks, so the level belongs in --config or --set")
    warm = jobs.pop("--warm")
    return arms, baseline, jobs, warm


@dataclass(frozen=True)
class Planned:
    """One run of the comparison: where it runs, its overrides (after the shared ones), its
    evaluation and its key (`run_key`)."""

    run_dir: Path
    overrides: list[str]
    eval_config: dict
    key: str


def plan_runs(args: argparse.Namespace, arms: dict[str, list[str]], jobs: dict, budget: list[str],
              weights: str) -> dict[tuple[str, int], Planned]:
    """Every (arm, seed) run, seeds outermost (so that on a queue every arm has its first seeds
    early)."""
    config_text = Path(args.config).read_text()
    planned = {}
    for seed in range(args.seeds):
        for arm, overrides in arms.items():
            seeded = [*args.set, *overrides, f"rollout.sampling.seed={seed}", f"learner.seed={seed}"]
            eval_config = evaluation_config(jobs[arm], args.eval_tasks)
            planned[arm, seed] = Planned(Path(args.out).resolve() / arm / f"seed_{seed}", seeded, eval_config,
                                         run_key(config_text, [*budget, *seeded], eval_config, weights))
    return planned


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    try:
        arms, baseline, jobs, warm_job = _check(args)
    except ValueError as exc:
        print(f"jobs.compare: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    warm = out / "warm"
    if not (warm / "warm_start_hf").exists():
        subprocess.run([sys.executable, "-m", "jobs.train", "--overwrite", "--config", args.config,
                        *args.set, *args.warm,
                        f"run.dir={warm}", "run.steps=1", "run.eval_every=0", "warm_start.export=true"], check=True)
    budget = [f"run.steps={args.steps}"] if args.steps else ["run.steps=1000000", f"run.max_wall_s={args.wall_s}"]
    weights = weights_identity(warm / "warm_start_hf")
    # Where every run starts from, on the same tasks.
    warm_eval = evaluation_config(warm_job, args.eval_tasks)
    warm_key = run_key(Path(args.config).read_text(), [], warm_eval, weights)
    warm_tasks = finished(warm / "eval_compare", warm_key)
    planned = plan_runs(args, arms, jobs, budget, weights)
    results = {k: finished(p.run_dir / "eval_compare", p.key) for k, p in planned.items()}
    for (arm, seed), result in results.items():
        if result is not None:
            print(f"jobs.compare: {arm} seed {seed}: reusing the finished run in {planned[arm, seed].run_dir}")
    if warm_tasks is None or None in results.values():
        common = [f"model.path={warm / 'warm_start_hf'}", "warm_start.num_episodes=0", *budget]
        warm_tasks, results = _run(args, warm_job, warm, (warm_eval, warm_key, warm_tasks), planned, results, common)
    return _write(results, baseline, args, out, sum(t["success"] for t in warm_tasks) / args.eval_tasks)


def _run(args: argparse.Namespace, warm_job, warm: Path, warm_evaluation: tuple[dict, str, list[dict] | None],
         planned: dict[tuple[str, int], Planned], results: dict, common: list[str]) -> tuple[list[dict], dict]:
    """The warm start's evaluation (its config, key and saved rows, if any) and the runs without a
    result, as Ray tasks."""
    address = args.address or os.environ.get("RAY_ADDRESS")
    if not address:
        from cluster.local import configure_loopback

        configure_loopback()  # before ray is imported (cluster/local.py)
    import ray

    plan = warm_job.cluster.plan.needs()
    run_task = ray.remote(num_cpus=plan.get("CPU", 1), num_gpus=plan.get("GPU", 0), max_retries=0)(run_arm_seed)
    if address:
        ray.init(address=address)
    else:
        from cluster.local import init_local_ray

        init_local_ray(num_cpus=warm_job.cluster.num_cpus)
    evaluate_task = ray.remote(num_cpus=1, max_retries=0)(evaluate_saved)
    warm_eval, warm_key, warm_tasks = warm_evaluation
    try:
        if warm_tasks is None:
            warm_tasks = evaluate_task.remote(str(warm / "warm_start_hf"), warm_eval, warm / "eval_compare", warm_key)
        pending = {k: result if result is not None else
                   run_task.remote(args.config, [*common, *planned[k].overrides], str(planned[k].run_dir),
                                   planned[k].eval_config, planned[k].key)
                   for k, result in results.items()}
        results = {k: v if isinstance(v, dict) else ray.get(v) for k, v in pending.items()}
        return (warm_tasks if isinstance(warm_tasks, list) else ray.get(warm_tasks)), results
    finally:
        ray.shutdown()


def _write(results: dict, baseline: str, args: argparse.Namespace, out: Path, warm_success: float) -> int:
    summary = summarize(results, baseline)
    pq.write_table(pa.Table.from_pylist([{"arm": arm, "run_seed": seed, "task_seed": task["seed"],
                                          "task_type": task["task_type"], "success": task["success"],
                                          "steps": r["steps"], "train_s": r["train_s"], "kl_slope": r.get("kl_slope"),
                                          "teacher_tokens": r.get("teacher_tokens"), "stopped_at": r.get("stopped_at")}
                                         for (arm, seed), r in results.items() for task in r["tasks"]]),
                   out / "runs.parquet")
    plot_curves(results, out / "curves.png")
    budget = f"{args.steps} learner steps" if args.steps else f"{args.wall_s:.0f} s of wall clock"
    header = (f"# {', '.join(summary)}: {args.seeds} seeds each, {budget} per run from one warm start "
              f"(itself {warm_success:.3f}), greedy eval on the first {args.eval_tasks} tasks of the eval split; "
              f"mean ± 95% CI over seeds")
    text = report(summary, baseline, header)
    (out / "compare.md").write_text(text)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(text + f"curves: {out / 'curves.png'}")
    fields = [f"baseline={baseline}", f"seeds={args.seeds}", f"eval_tasks={args.eval_tasks}",
              f"warm_start={warm_success:.3f}"]
    for arm, s in summary.items():
        fields += [f"{arm}_mean={s['overall'][0]:.3f}", f"{arm}_ci95={s['overall'][1]:.3f}"]
        if s["kl_slope"] is not None:
            fields += [f"{arm}_kl_slope={s['kl_slope'][0]:.4f}", f"{arm}_kl_slope_ci95={s['kl_slope'][1]:.4f}"]
        if s["teacher_stopped"][0]:
            fields += [f"{arm}_teacher_stopped={s['teacher_stopped'][0]}/{s['teacher_stopped'][1]}"]
        if s["no_signal"][0]:
            fields += [f"{arm}_no_signal={s['no_signal'][0]}/{s['no_signal'][1]}"]
        if s["vs_baseline"] is not None:
            fields += [f"{arm}_minus_{baseline}={s['vs_baseline'][0]:+.3f}", f"{arm}_minus_{baseline}_ci95="
                       f"{s['vs_baseline'][1]:.3f}"]
    print("RESULT " + " ".join(fields))
    return 0


if __name__ == "__main__":
    sys.exit(main())
