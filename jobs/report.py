"""Figures and a report.md from one or several finished runs.

    python -m jobs.report RUN_DIR [RUN_DIR ...] [--out DIR]

Reads each run's metrics.parquet (the step records, jobs/records.py) and warm_start.parquet
when there is one; several runs are overlaid, one colour per run, labelled by directory name
(the comparison users make: GRPO vs OPD vs TCOD vs RetireOPD). Writes into `--out` (default:
the single run's directory, or ./report for several):

    eval_success.png   greedy eval success vs learner version; per task type (dashed) for one
                       run; the end of the warm start marked
    train.png          train success and format-error rate of the episodes finished per step
    kl.png             sampled-token reverse KL(student || teacher) and top-k forward KL
    kl_by_turn.png     reverse KL by turn index (rows) over versions (columns), one panel per run
    mismatch.png       learner vs engine on the trained tokens: k3 KL, importance ratio mean and
                       max, shares masked and truncated by the corrections
    staleness.png      consumed samples by staleness (learner version - sample version)
    throughput.png     rollout tokens/s
    learner_time.png   learner step, wait-for-data and weight-sync seconds per step
    schedule.png       the algorithm's gauges (learner.algorithms.Gauge: OPD λ, TCOD's horizon
                       k, ...) and the version where its schedule stopped the teacher
    report.md          a table of final numbers per run and the figures

Versions count from the start of the run (warm-start SFT steps included), as in the records.
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from jobs.records import StepRecord, read_records

FIGURES = ("eval_success", "train", "kl", "kl_by_turn", "head_tail", "responses", "mismatch", "staleness", "throughput",
           "learner_time", "schedule")


@dataclass
class Run:
    label: str
    records: list[StepRecord]
    warm_end: int | None
    """Last warm-start version, None without a warm start."""
    warm_eval: float | None
    """Eval success at the end of the warm start."""

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """(versions, values) of a field, steps where it is None left out."""
        points = [(r.version, getattr(r, name)) for r in self.records if getattr(r, name) is not None]
        return [v for v, _ in points], [float(x) for _, x in points]


def load_run(directory: Path, label: str) -> Run:
    metrics = directory / "metrics.parquet"
    if not metrics.is_file():
        raise ValueError(f"{directory}: no metrics.parquet (is it a run directory of jobs.train?)")
    records = read_records(metrics)
    if not records:
        raise ValueError(f"{metrics} has no steps")
    warm_end = warm_eval = None
    warm = directory / "warm_start.parquet"
    if warm.is_file():
        rows = pq.read_table(warm, columns=["version", "eval_success"]).to_pylist()
        if rows:
            warm_end, warm_eval = rows[-1]["version"], rows[-1]["eval_success"]
    return Run(label, records, warm_end, warm_eval)


def _labels(directories: list[Path]) -> list[str]:
    names = [d.resolve().name for d in directories]
    if len(set(names)) == len(names):
        return names
    return [f"{d.resolve().parent.name}/{d.resolve().name}" for d in directories]


def _figure(title: str, ylabel: str, xlabel: str = "learner version"):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), constrained_layout=True)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _save(fig, path: Path, ax=None) -> None:
    import matplotlib.pyplot as plt

    if ax is not None and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _mark_warm_start(ax, runs: list[Run]) -> None:
    for i, run in enumerate(runs):
        if run.warm_end is not None:
            ax.axvline(run.warm_end, color=f"C{i}", linestyle=":", alpha=0.7,
                       label=f"{run.label}: warm start ends" if len(runs) > 1 else "warm start ends")


def plot_eval(runs: list[Run], path: Path) -> None:
    fig, ax = _figure("Greedy eval success", "success rate")
    for i, run in enumerate(runs):
        versions, values = run.series("eval_success")
        if run.warm_eval is not None:
            versions, values = [run.warm_end, *versions], [run.warm_eval, *values]
        ax.plot(versions, values, marker="o", color=f"C{i}", label=f"{run.label}" if len(runs) > 1 else "overall")
        if len(runs) == 1:
            types = sorted({t for r in run.records if r.eval_success_by_type for t in r.eval_success_by_type})
            for j, task_type in enumerate(types):
                points = [(r.version, r.eval_success_by_type[task_type]) for r in run.records
                          if r.eval_success_by_type and task_type in r.eval_success_by_type]
                ax.plot(*zip(*points), linestyle="--", marker=".", color=f"C{j + 1}", label=task_type)
    _mark_warm_start(ax, runs)
    ax.set_ylim(-0.02, 1.02)
    _save(fig, path, ax)


def _plot_lines(runs: list[Run], path: Path, title: str, ylabel: str, lines: list[tuple[str, str | tuple, str]],
                ylim: tuple[float, float] | None = None) -> None:
    """One line per (record field, line style, label) per run, in the run's colour; a field that is
    0 at every step (a term that is off) is left out."""
    fig, ax = _figure(title, ylabel)
    for i, run in enumerate(runs):
        prefix = f"{run.label}: " if len(runs) > 1 else ""
        for name, style, label in lines:
            versions, values = run.series(name)
            if any(values):
                ax.plot(versions, values, color=f"C{i}", linestyle=style, label=f"{prefix}{label}")
    if ylim is not None:
        ax.set_ylim(*ylim)
    _save(fig, path, ax)


def plot_train(runs: list[Run], path: Path) -> None:
    _plot_lines(runs, path, "Training episodes (finished during each step)", "rate",
                [("train_success_rate", "-", "success rate"), ("format_error_rate", "--", "format errors per turn")],
                ylim=(-0.02, 1.02))


def plot_kl(runs: list[Run], path: Path) -> None:
    _plot_lines(runs, path, "Student vs teacher on the trained tokens", "nats per token",
                [("reverse_kl", "-", "reverse KL (sampled token)"), ("topk_kl", "--", "forward KL (teacher top-k)")])


def plot_head_tail(runs: list[Run], path: Path) -> None:
    _plot_lines(runs, path, "Head vs tail of each response (first / second half of its tokens)", "nats per token",
                [("reverse_kl_head", "-", "reverse KL, head"), ("reverse_kl_tail", "--", "reverse KL, tail"),
                 ("student_logprob_head", "-.", "student log-prob, head"),
                 ("student_logprob_tail", ":", "student log-prob, tail")])


def plot_mismatch(runs: list[Run], path: Path) -> None:
    _plot_lines(runs, path, "Learner vs engine on the trained tokens (stale or mismatched)", "value",
                [("mismatch_kl", "-", "KL(engine || learner), k3"), ("ratio_mean", "--", "ratio mean"),
                 ("ratio_max", ":", "ratio max"), ("masked_frac", "-.", "share masked"),
                 ("truncated_frac", (0, (1, 3)), "share truncated")])


def plot_responses(runs: list[Run], path: Path) -> None:
    _plot_lines(runs, path, "Episodes finished during each step", "tokens / turns",
                [("response_tokens_per_turn", "-", "response tokens per turn"),
                 ("turns_to_success", "--", "turns to success")])


def plot_kl_by_turn(runs: list[Run], path: Path) -> None:
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(len(runs), 1, figsize=(7, 2.6 * len(runs) + 0.8), squeeze=False,
                             constrained_layout=True)
    for ax, run in zip(axes[:, 0], runs):
        num_turns = max((len(r.reverse_kl_by_turn or []) for r in run.records), default=0)
        grid = np.full((max(num_turns, 1), len(run.records)), np.nan)
        for col, r in enumerate(run.records):
            for turn, kl in enumerate(r.reverse_kl_by_turn or []):
                if kl is not None:
                    grid[turn, col] = kl
        versions = [r.version for r in run.records]
        image = ax.imshow(grid, aspect="auto", origin="lower", cmap="viridis", interpolation="nearest",
                          extent=(versions[0] - 0.5, versions[-1] + 0.5, -0.5, grid.shape[0] - 0.5))
        fig.colorbar(image, ax=ax, label="reverse KL (nats/token)")
        ax.set_title(f"Reverse KL by turn index: {run.label}")
        ax.set_xlabel("learner version")
        ax.set_ylabel("turn index")
    _save(fig, path)


def plot_staleness(runs: list[Run], path: Path) -> None:
    from collections import Counter

    fig, ax = _figure("Consumed samples by staleness", "share of trained samples",
                      xlabel="staleness (learner version - sample version)")
    width = 0.8 / len(runs)
    for i, run in enumerate(runs):
        counts = Counter(r.version - 1 - v for r in run.records for v in (r.sample_versions or []))
        total = sum(counts.values()) or 1
        keys = sorted(counts)
        ax.bar([k + (i - (len(runs) - 1) / 2) * width for k in keys], [counts[k] / total for k in keys],
               width=width, color=f"C{i}", label=run.label)
    ax.set_xticks(sorted({k for run in runs for r in run.records for k in
                          [r.version - 1 - v for v in (r.sample_versions or [])]}) or [0])
    _save(fig, path, ax if len(runs) > 1 else None)


def plot_throughput(runs: list[Run], path: Path) -> None:
    _plot_lines(runs, path, "Rollout throughput", "generated tokens / s",
                [("rollout_tokens_per_s", "-", "rollout tokens/s")])


def plot_learner_time(runs: list[Run], path: Path) -> None:
    _plot_lines(runs, path, "Learner time per step", "seconds",
                [("learner_step_s", "-", "train step"), ("learner_idle_s", "--", "waiting for data"),
                 ("weight_sync_s", ":", "weight publish")])


def plot_schedule(runs: list[Run], path: Path) -> None:
    from learner.algorithms import gauge_labels

    labels = gauge_labels()  # a gauge no registered algorithm declares goes by its name
    fig, ax = _figure("Algorithm gauges", "value")
    for i, run in enumerate(runs):
        prefix = f"{run.label}: " if len(runs) > 1 else ""
        names = list(dict.fromkeys(name for r in run.records for name in r.gauges))
        for name, style in zip(names, itertools.cycle(("-", "--", "-.", (0, (1, 1))))):
            points = [(r.version, r.gauges[name]) for r in run.records if name in r.gauges]
            ax.step(*zip(*points), where="post", color=f"C{i}", linestyle=style,
                    label=f"{prefix}{labels.get(name, name)}")
        stopped = _teacher_stopped_at(run.records)
        if stopped is not None:
            ax.axvline(stopped, color=f"C{i}", linestyle=":", label=f"{prefix}teacher stopped by the schedule")
    _mark_warm_start(ax, runs)
    _save(fig, path, ax)


def _teacher_stopped_at(records: list[StepRecord]) -> int | None:
    return next((r.version for r in records if r.teacher_stopped), None)


PLOTS = {"eval_success": plot_eval, "train": plot_train, "kl": plot_kl, "kl_by_turn": plot_kl_by_turn,
         "head_tail": plot_head_tail, "responses": plot_responses, "mismatch": plot_mismatch, "staleness": plot_staleness, "throughput": plot_throughput, "learner_time": plot_learner_time,
         "schedule": plot_schedule}
assert tuple(PLOTS) == FIGURES


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summary(run: Run) -> dict[str, str]:
    """The table row of a run: final and mean numbers."""
    records = run.records
    last = records[-5:]
    evals = [r.eval_success for r in records if r.eval_success is not None]
    wall = sum(r.wall_s for r in records)
    staleness = [r.version - 1 - v for r in records for v in (r.sample_versions or [])]
    stopped = _teacher_stopped_at(records)

    def fmt(value, digits=2):
        return "-" if value is None else f"{value:.{digits}f}"

    return {
        "run": run.label,
        "versions": f"{records[0].version}-{records[-1].version}",
        "warm start eval": fmt(run.warm_eval),
        "final eval": fmt(evals[-1] if evals else None),
        "best eval": fmt(max(evals) if evals else None),
        "train success (last 5)": fmt(_mean([r.train_success_rate for r in last if r.train_success_rate is not None])),
        "format errors/turn (last 5)": fmt(_mean([r.format_error_rate for r in last if r.format_error_rate is not None])),
        "reverse KL (last 5)": fmt(_mean([r.reverse_kl for r in last]), 3),
        "KL tail - head (last 5)": fmt(_mean([r.reverse_kl_tail - r.reverse_kl_head for r in last
                                              if r.reverse_kl_tail is not None and r.reverse_kl_head is not None]), 3),
        "turns to success (last 5)": fmt(_mean([r.turns_to_success for r in last if r.turns_to_success is not None]), 1),
        "rollout tokens/s": fmt(_mean([r.rollout_tokens_per_s for r in records]), 0),
        "learner idle": fmt(sum(r.learner_idle_s for r in records) / wall if wall else None),
        "mean staleness": fmt(_mean(staleness)),
        "dropped stale": str(records[-1].dropped_stale),
        "teacher stopped at": "-" if stopped is None else str(stopped),
        "wall clock (min)": fmt(wall / 60, 1),
    }


def write_report(runs: list[Run], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    for name, plot in PLOTS.items():
        plot(runs, out / f"{name}.png")
    rows = [summary(run) for run in runs]
    header = list(rows[0])
    lines = [f"# Report: {', '.join(run.label for run in runs)}", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row[h] for h in header) + " |" for row in rows]
    lines += ["", "Learner idle: time waiting for data over wall clock. Staleness: learner version minus the "
              "version that generated a trained sample.", ""]
    lines += [f"![{name}]({name}.png)\n" for name in FIGURES]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jobs.report", description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (run.dir of jobs.train)")
    parser.add_argument("--out", type=Path, help="output directory (default: the run's, or ./report for several)")
    args = parser.parse_args(argv)
    try:
        runs = [load_run(d, label) for d, label in zip(args.runs, _labels(args.runs))]
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    out = args.out or (args.runs[0] if len(args.runs) == 1 else Path("report"))
    print(f"wrote {write_report(runs, out)} and {len(FIGURES)} figures")


if __name__ == "__main__":
    main()
