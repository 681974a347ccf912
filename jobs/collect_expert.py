"""Collect an expert's trajectories τ* over a split, for TCOD-B2F (learner/curriculum.py).

    python -m jobs.collect_expert [--config FILE.yaml] [key.sub=value ...] [--dry-run]

Runs the environment's own expert (`TextEnv.expert()`: the BabyAI bot) on tasks
`first_seed .. first_seed + num_tasks - 1` of `split`, at most `max_turns` calls each, and
writes `expert.parquet` (split, seed, task_type, success, num_turns, calls as JSON strings)
and `manifest.json` (the config, counts, success rate) to `output_dir`. Failed tasks are
kept and marked: B2F replays only successes and lets the student play the rest alone.
Use the same `env` section and turn limit as the training job.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from envs.registry import EnvSection, default_env_config
from jobs.config import config_from_cli


class CollectExpertConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    env: EnvSection = Field(default_factory=default_env_config)
    split: str = "train"
    first_seed: int = Field(default=0, ge=0)
    num_tasks: int = Field(default=2000, ge=1)
    """Training workers draw seeds 0, 1, 2, ... of the train split: cover as many as the run will use."""
    max_turns: int = Field(default=20, ge=1)
    """The training loop's turn limit (rollout.loop.max_turns): a longer τ* could never be replayed."""
    output_dir: str = "runs/expert"


def collect(config: CollectExpertConfig, on_task=None) -> list[dict]:
    """One row per task: the expert's calls and whether they solved it."""
    from envs.registry import make_env

    env = make_env(config.env)
    if config.split not in env.splits:
        raise ValueError(f"split: environment {config.env.name!r} has no split {config.split!r}; "
                         f"its splits: {list(env.splits)}")
    rows = []
    for seed in range(config.first_seed, config.first_seed + config.num_tasks):
        reset = env.reset(seed, config.split)
        expert = env.expert()
        if expert is None:
            raise ValueError(f"environment {config.env.name!r} has no expert to collect from")
        calls, executed, success = [], None, False
        for _ in range(config.max_turns):
            call = expert.act(executed)
            if call is None:
                break
            calls.append(json.dumps({"name": call.name, "arguments": call.arguments}))
            step = env.step(call)
            executed = call
            if step.done:
                success = step.success
                break
        rows.append({"split": config.split, "seed": seed, "task_type": reset.info.task_type, "success": success,
                     "num_turns": len(calls), "calls": calls})
        if on_task is not None:
            on_task()
    return rows


def write(config: CollectExpertConfig, rows: list[dict], wall_s: float) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from learner.curriculum import EXPERT_FILE, MANIFEST_FILE

    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("split", pa.string()), ("seed", pa.int64()), ("task_type", pa.string()),
                        ("success", pa.bool_()), ("num_turns", pa.int32()), ("calls", pa.list_(pa.string()))])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), out / EXPERT_FILE)
    num_solved = sum(r["success"] for r in rows)
    (out / MANIFEST_FILE).write_text(json.dumps({
        "config": config.model_dump(mode="json"), "num_tasks": len(rows), "num_solved": num_solved,
        "success_rate": num_solved / len(rows), "mean_turns_solved":
            sum(r["num_turns"] for r in rows if r["success"]) / max(num_solved, 1), "wall_s": wall_s}, indent=2))
    return out


def main(argv: list[str] | None = None) -> int:
    config = config_from_cli(CollectExpertConfig, "python -m jobs.collect_expert", __doc__.split("\n")[0], argv)
    from tqdm import tqdm

    start = time.perf_counter()
    try:
        with tqdm(total=config.num_tasks, desc=f"expert {config.split}", unit="task", file=sys.stderr) as bar:
            rows = collect(config, on_task=bar.update)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    out = write(config, rows, time.perf_counter() - start)
    solved = sum(r["success"] for r in rows)
    print(f"expert solved {solved}/{len(rows)} tasks of {config.split}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
