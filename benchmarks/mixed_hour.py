"""The seed's own level within a wall-clock budget: a student from scratch, a curriculum, eval50.

Everything from the first demonstration to the final evaluation runs inside `--wall-s` (default
one hour), measured from this script's start:

1. curriculum stages, each a `python -m jobs.train` of `jobs/configs/babyai_mixed_hour.yaml`
   with the stage's overrides, starting from the stage before's exported policy (`hf/`), of
   `starter` (6x6 room, no distractor, go_to and pick_up), `distractors` (2 distractors),
   `room` (8x8 room, 4 distractors) and `mixed` (the study's MixedTrainLocal with its six task
   types, the file as is). By default two: `starter`, then `mixed`.
   A stage clones the bot's demonstrations of its level (the warm start's SFT) for the share F of
   its clock (`--sft-share`; the rate's cosine ends with it) and runs DAgger for the rest: the
   config's OPD against the oracle teacher with the top-k term alone (the bot's call at every
   state the student reached) in rounds of weights published every 60 steps, each batch with the
   warm start's demonstrations and past batches beside the fresh one (`aggregate`,
   docs/babyai_text.md, "The aggregate in the job"). Defaults: F = 1 (cloning alone, ending early
   when its evaluation reaches the stage's target, `run.target_eval_success`), and F = 0.02 for
   `mixed` (its minute goes to collecting the bot's 8,192 demonstrations, ~100 s, which leaves no
   SFT step: the aggregate's demonstrations beside every batch are the cloning on this level; then
   DAgger for the rest of the hour: 0.20 on eval50 where cloning every stage of the four had
   reached 0.14 and 0.14, 0.22 and 0.26 with the learner compiled, 0.30 and 0.32 with the config as
   shipped, its roll-outs at temperature 0.5; docs/babyai_text.md, "The job's hour in the probe's
   shape", "A compiled learner", "Greedy cycles"). A stage may use its share of the budget at
   most; the last stage gets whatever is left;
2. `jobs.evaluate` of the final policy on eval50 as the seed defines it (the fixed 50 tasks,
   20 turns, greedy): inside the budget;
3. outside the budget, the floor and the ceiling on the same tasks: `policy=random` (a random
   tool every turn) and `policy=expert` (the bot).

Per task type it prints the final policy's failure modes (jobs.evaluate: format, navigation,
object choice, interaction, sequencing; envs/babyai_text/diagnosis.py), the tools it called, and
its failed episodes that ended in a cycle (`cycled`: the same view, last call and answer repeating
to the end, jobs.evaluate.cycle_period; the greedy policy cannot leave it).

    python benchmarks/mixed_hour.py [--wall-s 3600] [--seed 0] [--out runs/mixed_hour]
        [--stages starter,mixed] [--sft-share [STAGE=]F ...] [--set KEY=VALUE ...]

`--stages` runs a subset of the curriculum, in its order (the last one given gets the rest of the
hour); `--sft-share F` sets every stage's share, `--sft-share mixed=0.05` one stage's (later ones
win over the defaults). The cloning curriculum measured before (0.14, 0.14): `--stages
starter,distractors,room,mixed --sft-share 1`.

`--set` overrides the config in every stage (after the stage's own) and in the final eval50, e.g.
BabyAI-Text's own observation order: `--set env.observation_order=scan`; DAgger on the fresh batch
alone: `--set aggregate.num_demonstration_samples=0 --set aggregate.num_replayed_samples=0`.

Goal (issue: the seed's level on a laptop): eval50 >= 0.3 within 3,600 s on 2 cores (document
000's Qwen3-14B with GRPO: 0.30-0.36); stretch 0.5.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from learning_opd import evaluate  # benchmarks/ is on sys.path when run as a script

CONFIG = "jobs/configs/babyai_mixed_hour.yaml"
FINAL_EVAL_S = 90.0
"""Kept back from the last stage for the final eval50 run (a vLLM start and 50 greedy episodes)."""
JOB_START_S = 60.0
"""A job's start before its wall clock (run.max_wall_s) begins: imports, Ray, actors, engine."""
DEFAULT_SFT_SHARE = "mixed=0.02"
"""The study's level: the warm start's minute collects the demonstrations (no SFT step fits), then
the config's DAgger (a given `--sft-share` wins)."""
FILL_EPOCHS = 50
"""Passes over a stage's demonstrations at most: enough that its time, not its data, ends its SFT."""
STAGE_END_S = 60.0
"""A stage's end after its clock: the evaluation that ends its warm start (40 tasks, or eval50 on
the last stage), the checkpoint, the export, closing."""


@dataclass(frozen=True)
class Stage:
    name: str
    overrides: tuple[str, ...]
    share: float
    """Fraction of the budget the stage may use at most (the last stage: the rest)."""
    target: float | None
    """Eval success that ends the stage early; None: the stage runs to its share."""


_LOCAL = ("env.task_types=[go_to,pick_up]",)
# Every 25 steps: at 3-4 s a step, an evaluation every 10 took a fifth of a stage's loop.
_STAGE_EVAL = ("run.eval_split=eval", "run.eval_every=25", "run.eval_tasks=40")
# About one pass over its demonstrations in a stage's time at the measured rates on 2 cores
# (6x6 room ~3.9 SFT steps/s, the 8x8 room ~2.6, the study's level ~1.2; 4 episodes a step):
# 2,048 demonstrations cloned for a whole stage were passed over 3-4 times.
_FILL = "warm_start.num_episodes=8192"
STAGES = (
    Stage("starter", ("env.room_size=6", "env.num_distractors=0", *_LOCAL, *_STAGE_EVAL), 0.1, 0.8),
    # Binding the mission's words to one of several objects is what a student fails at first.
    Stage("distractors", ("env.room_size=6", "env.num_distractors=2", *_LOCAL, *_STAGE_EVAL, _FILL), 0.2, 0.6),
    Stage("room", ("env.num_distractors=4", *_LOCAL, *_STAGE_EVAL, _FILL), 0.2, 0.5),
    Stage("mixed", (_FILL,), 1.0, None),
)


def eval_curve(run_dir: Path) -> list[tuple[int, float]]:
    """(version, eval success) of the warm start's end and every periodic evaluation."""
    rows = []
    for name in ("warm_start.parquet", "metrics.parquet"):
        if (run_dir / name).exists():
            rows += [(r["version"], r["eval_success"]) for r in pq.read_table(run_dir / name).to_pylist()
                     if r.get("eval_success") is not None]
    return rows


def sft_shares(given: list[str], stages: list[str], parser: argparse.ArgumentParser) -> dict[str, float]:
    """Each stage's SFT share from `--sft-share` values `F` (every stage) or `STAGE=F`, later ones winning."""
    shares = dict.fromkeys(stages, 1.0)
    for item in given:
        name, _, value = item.rpartition("=")
        if name and name not in shares:
            parser.error(f"--sft-share {item}: unknown stage {name!r}; known: {', '.join(stages)}")
        try:
            share = float(value)
        except ValueError:
            parser.error(f"--sft-share {item}: {value!r} is not a number")
        if not 0 < share <= 1:
            parser.error(f"--sft-share {item}: the share must be in (0, 1]")
        shares.update({name: share} if name else dict.fromkeys(stages, share))
    return shares


def counts(named: dict[str, int]) -> str:
    return " ".join(f"{name}:{n}" for name, n in named.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--wall-s", type=float, default=3600.0)
    parser.add_argument("--seed", type=int, default=0, help="model init, sampling and demonstration seeds")
    parser.add_argument("--out", default="runs/mixed_hour")
    parser.add_argument("--stages", default="starter,mixed",
                        help="the stages to run, comma-separated, in the curriculum's order")
    parser.add_argument("--sft-share", action="append", default=[], metavar="[STAGE=]F",
                        help="share of a stage's clock its warm start's SFT fills, the rest the run's loop "
                             f"(DAgger); F alone: every stage (default 1, {DEFAULT_SFT_SHARE} after it); repeatable")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every stage, after the stage's own (repeatable)")
    args = parser.parse_args()
    known = [stage.name for stage in STAGES]
    names = args.stages.split(",")
    if unknown := set(names) - set(known):
        parser.error(f"--stages: unknown {sorted(unknown)}; known, in order: {', '.join(known)}")
    stages = [stage for stage in STAGES if stage.name in names]
    sft_share = sft_shares([DEFAULT_SFT_SHARE, *args.sft_share], known, parser)
    from jobs.config import load_config
    from jobs.train import JobConfig

    start = time.monotonic()
    deadline = start + args.wall_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeded = (f"model.seed={args.seed}", f"rollout.sampling.seed={args.seed}", f"warm_start.seed={args.seed}",
              f"warm_start.first_seed={500_000_000 + 100_000 * args.seed}")
    configured = {stage.name: [*seeded, *stage.overrides, *args.set] for stage in stages}
    # Every stage's loop runs on a clock (run.max_wall_s, below), which the config's schedule may need.
    clocked = f"run.max_wall_s={args.wall_s:.0f}"
    for overrides in configured.values():  # a bad --set fails here, not an hour in
        load_config(JobConfig, CONFIG, [*overrides, clocked])
    model_path, curves = None, {}
    for i, stage in enumerate(stages):
        last = i == len(stages) - 1
        left = deadline - time.monotonic() - FINAL_EVAL_S
        budget = left if last else min(left, stage.share * args.wall_s)
        if budget < 2 * JOB_START_S:
            print(f"stage {stage.name}: skipped, {left:.0f} s left", flush=True)
            continue
        run_dir = out / stage.name
        clock = budget - JOB_START_S - STAGE_END_S
        # The warm start's cosine ends with the stage's clock, or its share of it: the run's loop has the
        # rest. (The run's clock starts before the warm start's: it would cut a warm start filling it.)
        share = sft_share[stage.name]
        timing = ["run.steps=0"] if share == 1 else [f"run.max_wall_s={clock:.0f}"]
        overrides = [*configured[stage.name], f"run.dir={run_dir}", *timing,
                     f"warm_start.max_wall_s={share * clock:.0f}", f"warm_start.epochs={FILL_EPOCHS}"]
        if stage.target is not None:
            overrides.append(f"run.target_eval_success={stage.target}")
        if model_path is not None:
            overrides.append(f"model.path={model_path}")
        print(f"stage {stage.name}: up to {budget:.0f} s, {' '.join(stage.overrides) or 'the study level'}",
              flush=True)
        stage_start = time.monotonic()
        with open(out / f"{stage.name}.log", "w") as log:  # the job's console, for its step lines
            subprocess.run([sys.executable, "-m", "jobs.train", "--overwrite", "--config", CONFIG, *overrides],
                           check=True, stdout=log)
        model_path = str(run_dir / "hf")
        curves[stage.name] = eval_curve(run_dir)
        print(f"stage {stage.name}: {time.monotonic() - stage_start:.0f} s, eval (version:success) "
              + " ".join(f"{v}:{s:.2f}" for v, s in curves[stage.name]), flush=True)
    assert model_path is not None, "no stage ran: --wall-s is too small"
    # eval50 on the study's level as the stages saw it: the file with --set (e.g. the observation's form).
    job = load_config(JobConfig, CONFIG, [*args.set, f"run.dir={out}", clocked])
    final = evaluate(job, model_path, "model", out / "eval_final", 50)
    wall = time.monotonic() - start
    random = evaluate(job, job.model.path, "random", out / "eval_random", 50)
    expert = evaluate(job, job.model.path, "expert", out / "eval_expert", 50)
    print(f"{'task type':<22}{'random':>8}{'expert':>8}{'final':>8}{'cycled':>8}  final's failures; its tool calls")
    for name in final:
        print(f"{name:<22}" + "".join(f"{s.get(name, {}).get('success_rate', 0):>8.3f}"
                                      for s in (random, expert, final)) + f"{final[name]['num_cycled']:>8}"
              + f"  {counts(final[name].get('failure_modes', {}))}; {counts(final[name].get('tool_calls', {}))}")
    by_type = ",".join(f"{name}:{s['success_rate']:.2f}" for name, s in final.items() if name != "overall")
    (out / "mixed_hour.json").write_text(json.dumps({"wall_s": wall, "final": final, "random": random,
                                                      "expert": expert, "curves": curves}, indent=1))
    print(f"RESULT eval50_success={final['overall']['success_rate']:.3f} eval50_by_type={by_type} "
          f"wall_s={wall:.0f} random={random['overall']['success_rate']:.3f} "
          f"expert={expert['overall']['success_rate']:.3f} "
          f"eval50_failures={counts(final['overall'].get('failure_modes', {})).replace(' ', ',') or '-'} "
          f"eval50_cycled={final['overall']['num_cycled']}")


if __name__ == "__main__":
    main()
