"""Diagnostics of a student against its teacher, on the student's own samples (docs/algorithms.md §8).

    python -m jobs.diagnose gap          --config JOB.yaml [key.sub=value ...] [--episodes N] [--bins B]
    python -m jobs.diagnose continuation --config JOB.yaml [key.sub=value ...] [--episodes N] [--prefix 0,0.5,0.8]

Both read a training job's config (model, rollout, env, teacher), play N student episodes with
the rollout's engine and sampling on `rollout.split`, and look at their trainable turns:

- gap: the student's and the teacher's log-probs of the sampled tokens by relative position in
  each response (B bins, head to tail) and their difference, the sampled-token reverse KL. Any
  teacher backend, the oracle included. The seeds' evidence that OPD trains the tail of long
  responses less than the head.
- continuation: the teacher writes the rest of each response after the student's first p of its
  tokens (greedy, the rollout's token budget), and the environment's parser checks the whole:
  format pass rate by p, overall and over the longer half of the responses. p=0 is the
  teacher's own answer, p=1 the student's. Needs a teacher that writes (teacher.backend hf or
  vllm). The seeds' test of whether a teacher still "catches" a long student prefix.

Point model.path at a run's export (RUN_DIR/hf) to diagnose a trained student. Prints a table and
writes <check>.json to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from buffer.contracts import Trajectory, Turn
from jobs.config import ConfigError, load_config


def student_trajectories(config, num_episodes: int) -> list[Trajectory]:
    """N sampled episodes of the job's student on rollout.split (seeds 0..N-1)."""
    from actors.agent_loop import EpisodeTask, ModelPolicy, run_episodes
    from actors.rollout_worker import build_engine
    from envs.registry import make_env
    from models.loading import load_tokenizer

    rollout = config.rollout
    tokenizer = load_tokenizer(config.model)
    engine = build_engine(rollout, config.model, tokenizer)
    try:
        policy = ModelPolicy(engine, tokenizer, rollout.sampling, rollout.loop)
        results = run_episodes(lambda: make_env(config.env), [EpisodeTask(rollout.split, s) for s in range(num_episodes)],
                               policy, rollout.loop, batch_size=rollout.num_envs, progress="student episodes")
    finally:
        engine.close()
    return [r.trajectory for r in results]


def gap_by_position(turns: list[Turn], teacher_logprobs: list[tuple[float, ...]], num_bins: int) -> list[dict]:
    """Per bin of relative position in the response: tokens, mean student and teacher log-prob,
    and their gap (student - teacher). Token t of an n-token response falls in bin t*B//n."""
    sums = [[0, 0.0, 0.0] for _ in range(num_bins)]
    for turn, teacher in zip(turns, teacher_logprobs, strict=True):
        n = len(turn.response_ids)
        for t, (student, scored) in enumerate(zip(turn.behaviour_logprobs, teacher, strict=True)):
            cell = sums[t * num_bins // n]
            cell[0] += 1
            cell[1] += student
            cell[2] += scored
    return [{"position": f"{b / num_bins:.0%}-{(b + 1) / num_bins:.0%}", "tokens": count,
             "student_logprob": student / count if count else None,
             "teacher_logprob": teacher / count if count else None,
             "gap": (student - teacher) / count if count else None}
            for b, (count, student, teacher) in enumerate(sums)]


def run_gap(config, trajectories: list[Trajectory], num_bins: int) -> list[dict]:
    from teacher.service import build_scorer

    scorer = build_scorer(config.teacher, config.model, config.env, config.rollout.loop.prompt)
    scores = scorer.score_trajectories(trajectories)
    turns, teacher = [], []
    for trajectory, turn_scores in zip(trajectories, scores, strict=True):
        for turn, s in zip(trajectory.turns, turn_scores, strict=True):
            if turn.trainable and turn.response_ids:
                turns.append(turn)
                teacher.append(s.logprobs)
    return gap_by_position(turns, teacher, num_bins)


def prefix_length(turn: Turn, fraction: float) -> int:
    return int(fraction * len(turn.response_ids))


def check_writing_teacher(config) -> None:
    from teacher.registry import teacher_backend

    if config.teacher is None or not teacher_backend(config.teacher.backend).loads_model:
        raise ValueError("the continuation test needs a teacher that writes text: set teacher.backend=hf (or vllm) "
                         "and teacher.model.path; the oracle scores tokens but does not generate")


def run_continuation(config, trajectories: list[Trajectory], fractions: list[float]) -> list[dict]:
    """Format pass rate of (student prefix + teacher continuation) by prefix fraction."""
    from actors.engine import SamplingConfig
    from actors.rollout_worker import build_engine
    from envs.parser import ToolCallParser
    from envs.registry import make_env
    from models.loading import load_tokenizer

    check_writing_teacher(config)
    tokenizer = load_tokenizer(config.teacher.model)
    parser = ToolCallParser(make_env(config.env).tools, mode="strict")
    turns = [t for trajectory in trajectories for t in trajectory.turns if t.trainable and t.response_ids]
    long_cut = sorted(len(t.response_ids) for t in turns)[len(turns) // 2]
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=config.rollout.sampling.max_new_tokens)
    engine = build_engine(config.rollout, config.teacher.model, tokenizer)
    rows = []
    try:
        for fraction in fractions:
            prefixes = [list(t.response_ids[:prefix_length(t, fraction)]) for t in turns]
            # A prefix that is the whole response (p=1) is the student's answer: nothing to continue.
            todo = [i for i, t in enumerate(turns) if len(prefixes[i]) < len(t.response_ids)]
            generated = engine.generate([list(turns[i].prompt_ids) + prefixes[i] for i in todo], greedy)
            for i, g in zip(todo, generated):
                prefixes[i] += g.token_ids
            passed = [parser.parse(tokenizer.decode(ids, skip_special_tokens=True)).well_formed for ids in prefixes]
            long = [ok for ok, t in zip(passed, turns) if len(t.response_ids) >= long_cut]
            rows.append({"prefix": fraction, "turns": len(turns), "pass_rate": sum(passed) / len(passed),
                         "mean_prefix_tokens": sum(prefix_length(t, fraction) for t in turns) / len(turns),
                         f"pass_rate_len>={long_cut}": sum(long) / len(long)})
    finally:
        engine.close()
    return rows


def format_rows(rows: list[dict]) -> str:
    def cell(value) -> str:
        if value is None:
            return "-"
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    header = list(rows[0])
    widths = [max(len(h), *(len(cell(r[h])) for r in rows)) + 2 for h in header]
    lines = ["".join(h.rjust(w) for h, w in zip(header, widths))]
    lines += ["".join(cell(r[h]).rjust(w) for h, w in zip(header, widths)) for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from jobs.train import JobConfig

    parser = argparse.ArgumentParser(prog="python -m jobs.diagnose", description=__doc__.split("\n")[0])
    parser.add_argument("check", choices=("gap", "continuation"))
    parser.add_argument("--config", help="a training job's YAML (JobConfig)")
    parser.add_argument("--episodes", type=int, default=32, help="student episodes to sample")
    parser.add_argument("--bins", type=int, default=4, help="gap: position bins per response")
    parser.add_argument("--prefix", default="0,0.2,0.4,0.6,0.8,1",
                        help="continuation: comma-separated prefix fractions in [0, 1]")
    parser.add_argument("--out", default="runs/diagnose", help="directory of the JSON result")
    parser.add_argument("overrides", nargs="*", help="key.sub=value")
    args = parser.parse_intermixed_args(argv)
    try:
        config = load_config(JobConfig, args.config, args.overrides)
        fractions = [float(p) for p in args.prefix.split(",")]
        if args.episodes < 1 or args.bins < 1 or not all(0 <= p <= 1 for p in fractions):
            raise ValueError(f"need --episodes >= 1, --bins >= 1 and prefix fractions in [0, 1]; got "
                             f"{args.episodes}, {args.bins}, {args.prefix}")
        if args.check == "continuation":
            check_writing_teacher(config)
    except (ConfigError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 2
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    torch.set_num_threads(config.rollout.num_threads or 1)
    trajectories = student_trajectories(config, args.episodes)
    if args.check == "gap":
        rows = run_gap(config, trajectories, args.bins)
    else:
        rows = run_continuation(config, trajectories, fractions)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.check}.json").write_text(json.dumps({"check": args.check, "episodes": args.episodes,
                                                        "model": config.model.path, "rows": rows}, indent=2))
    print(format_rows(rows))
    print(f"{args.check}: {len(trajectories)} student episodes of {config.model.path}; wrote {out / args.check}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
