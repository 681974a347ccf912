"""Evaluate a policy on an environment's split: success rate per task type.

    python -m jobs.evaluate [--config FILE.yaml] [key.sub=value ...] [--dry-run]

By default: the zero-shot tiny model, greedy, on the study's 50-task `eval50` split.
`policy=expert` runs the environment's expert (the BabyAI bot) instead (the ceiling, and a check of the environment
and loop); `policy=random` calls a uniformly random tool every turn (the floor).
Writes a table to stdout and `results.json` + `episodes.parquet` to `output_dir`; where the
environment can tell (BabyAI-Text), each failed episode of the model's gets a failure mode
(format, navigation, object choice, interaction, sequencing; docs/babyai_text.md).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from actors.agent_loop import EpisodeResult, EpisodeTask, LoopConfig
from actors.engine import SamplingConfig
from actors.vllm_engine import VLLMConfig
from envs.protocol import TextEnv, ToolCall
from envs.registry import EnvSection, default_env_config, make_env
from jobs.config import config_from_cli
from models.loading import ModelConfig


class EvaluateConfig(BaseModel):
    """Everything an evaluation run needs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: Literal["model", "expert", "random"] = "model"
    model: ModelConfig = ModelConfig()
    engine: Literal["hf", "vllm"] = "vllm"
    """Inference engine of policy=model (see RolloutConfig.engine)."""
    vllm: VLLMConfig = VLLMConfig()
    """How engine=vllm starts (dtype, context length, its engine core in this process or its own):
    as a training job's `rollout.vllm`."""
    env: EnvSection = Field(default_factory=default_env_config)
    """The environment (`name` picks a registered one), as in a training job's `env` section."""
    loop: LoopConfig = LoopConfig()
    sampling: SamplingConfig = SamplingConfig(temperature=0.0, max_new_tokens=48)
    split: str = "eval50"
    num_tasks: int | None = Field(default=None, ge=1)
    """Tasks to run; default: the whole split (required for the unbounded train/eval splits)."""
    first_seed: int = Field(default=0, ge=0)
    batch_size: int = Field(default=25, ge=1)
    """Episodes advanced together (one batched generation per turn)."""
    num_threads: int = Field(default=1, ge=1)
    """Torch intra-op threads (2 shared cores: keep 1)."""
    output_dir: str = "runs/evaluate"

    @model_validator(mode="after")
    def _check_split(self) -> "EvaluateConfig":
        env = make_env(self.env)
        if self.split not in env.splits:
            raise ValueError(f"split must be one of {list(env.splits)}, got {self.split!r}")
        size = env.split_size(self.split)
        if size is None and self.num_tasks is None:
            raise ValueError(f"split {self.split!r} is unbounded: set num_tasks")
        if size is not None and self.first_seed + (self.num_tasks or size) > size:
            raise ValueError(f"split {self.split!r} has {size} tasks; first_seed + num_tasks exceeds it")
        return self

    def tasks(self) -> list[EpisodeTask]:
        count = self.num_tasks or make_env(self.env).split_size(self.split)
        return [EpisodeTask(self.split, self.first_seed + i) for i in range(count)]


def executed_calls(result: EpisodeResult) -> list[ToolCall | None]:
    """The call each action turn executed (None: nothing); [] without a token-level record."""
    turns = result.trajectory.turns if result.trajectory is not None else ()
    return [None if t.executed_call is None else ToolCall.from_json(t.executed_call)
            for t in turns if t.stage == "action"]


def views_answered(env: TextEnv, result: EpisodeResult) -> list[str]:
    """The view each action turn of an episode answered, replayed from the task's reset (`reset` is
    deterministic) through the executed calls; a turn that did not act leaves the view as it was."""
    view = env.reset(result.info.seed, result.info.split).observation
    views = []
    for call in executed_calls(result):
        views.append(view)
        if call is not None:
            view = env.step(call).observation
    return views


def cycle_period(result: EpisodeResult, views: list[str]) -> int | None:
    """The period (in action turns) of the cycle a failed episode ended in, or None: the first turn
    that repeats an earlier one -- the same view, after the same call, answered alike -- from which
    every turn to the end repeats the turn one period before. A greedy policy whose prompt shows only
    the current view and the last call (history_window 0) then repeats itself for ever (turn left,
    turn right, ...); with `revisits` in the prompt each lap's prompts differ, and this still sees
    the same circuit walked (docs/babyai_text.md, "Greedy cycles"). None also for a success or an
    episode without a token-level record. `views`: `views_answered`."""
    if result.success or result.trajectory is None:
        return None
    turns = [t for t in result.trajectory.turns if t.stage == "action"]
    keys = list(zip(views, [None] + [t.executed_call for t in turns[:-1]], [t.response_ids for t in turns],
                    strict=True))
    last_seen: dict[tuple, int] = {}
    for i, key in enumerate(keys):
        if key in last_seen:
            period = i - last_seen[key]
            if all(keys[k] == keys[k - period] for k in range(i, len(keys))):
                return period
        last_seen[key] = i
    return None


def cycle_periods(env: TextEnv, results: list[EpisodeResult]) -> list[int | None]:
    """`cycle_period` of every episode (None for those without a token-level record: expert, random)."""
    return [None if r.success or r.trajectory is None else cycle_period(r, views_answered(env, r))
            for r in results]


def failure_modes(env: TextEnv, results: list[EpisodeResult]) -> list[str | None]:
    """Each failed episode's failure mode, from an environment that can tell
    (`env.failure_mode(split, seed, executed_calls)`, e.g. BabyAI-Text's); None for a success, an
    episode without a token-level record (expert, random), or an environment that cannot."""
    diagnose = getattr(env, "failure_mode", None)
    if diagnose is None:
        return [None] * len(results)
    return [None if r.success or r.trajectory is None else diagnose(r.info.split, r.info.seed, executed_calls(r))
            for r in results]


def summarize(results: list[EpisodeResult], modes: list[str | None] | None = None,
              periods: list[int | None] | None = None) -> dict[str, dict]:
    """Per task type and overall: episodes, success rate, mean turns, format error rate, the
    executed tool calls by name (model policies), where `periods` are given the failed episodes
    that ended in a cycle (`cycle_periods`), and, where `modes` diagnosed some failures, their count
    per failure mode."""
    modes = modes or [None] * len(results)
    groups: dict[str, list[tuple[EpisodeResult, str | None, int | None]]] = defaultdict(list)
    for row in zip(results, modes, periods or [None] * len(results), strict=True):
        groups[row[0].info.task_type].append(row)
    groups = dict(sorted(groups.items()))
    groups["overall"] = [row for rows in groups.values() for row in rows]
    summary = {}
    for name, rows in groups.items():
        rs = [r for r, _, _ in rows]
        turns = sum(r.num_turns for r in rs)
        summary[name] = {
            "num_episodes": len(rs),
            "success_rate": sum(r.success for r in rs) / len(rs),
            "mean_turns": turns / len(rs),
            "format_error_rate": sum(r.num_format_errors for r in rs) / max(turns, 1),
        }
        if periods is not None and any(r.trajectory is not None for r in results):
            summary[name]["num_cycled"] = sum(period is not None for _, _, period in rows)
        if any(modes):
            summary[name]["failure_modes"] = dict(sorted(Counter(m for _, m, _ in rows if m is not None).items()))
        calls = Counter(call.name if call else "(none)" for r in rs for call in executed_calls(r))
        if calls:
            # A policy that never calls some tool fails every task needing it (docs/babyai_text.md).
            summary[name]["tool_calls"] = dict(calls.most_common())
    return summary


def format_table(summary: dict[str, dict]) -> str:
    width = max(22, *(len(name) + 2 for name in summary))
    lines = [f"{'task type':<{width}}{'episodes':>9}{'success':>9}{'turns':>8}{'fmt err':>9}{'cycled':>8}  failures"]
    for name, s in summary.items():
        failures = " ".join(f"{mode}:{n}" for mode, n in s.get("failure_modes", {}).items())
        lines.append(f"{name:<{width}}{s['num_episodes']:>9}{s['success_rate']:>9.3f}"
                     f"{s['mean_turns']:>8.1f}{s['format_error_rate']:>9.3f}{s.get('num_cycled', '-'):>8}"
                     f"  {failures}".rstrip())
    return "\n".join(lines)


def write_outputs(config: EvaluateConfig, results: list[EpisodeResult], modes: list[str | None],
                  periods: list[int | None], summary: dict, wall_s: float) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(
        {"config": config.model_dump(mode="json"), "summary": summary, "wall_s": wall_s}, indent=2))
    table = pa.table({
        "split": [r.info.split for r in results],
        "seed": pa.array([r.info.seed for r in results], pa.int64()),
        "task_type": [r.info.task_type for r in results],
        "success": [r.success for r in results],
        "num_turns": pa.array([r.num_turns for r in results], pa.int32()),
        "num_format_errors": pa.array([r.num_format_errors for r in results], pa.int32()),
        "failure_mode": pa.array(modes, pa.string()),
        "cycle_period": pa.array(periods, pa.int32()),
    })
    pq.write_table(table, out / "episodes.parquet")
    return out


def build_policy(config: EvaluateConfig):
    if config.policy == "expert":
        from actors.expert import ExpertPolicy

        return ExpertPolicy()
    if config.policy == "random":
        from actors.random_policy import RandomPolicy

        return RandomPolicy()
    from actors.agent_loop import ModelPolicy
    from actors.rollout_worker import RolloutConfig, build_engine
    from models.loading import load_tokenizer

    tokenizer = load_tokenizer(config.model)
    rollout = RolloutConfig(engine=config.engine, num_threads=config.num_threads, vllm=config.vllm)
    return ModelPolicy(build_engine(rollout, config.model, tokenizer), tokenizer, config.sampling, config.loop)


def main(argv: list[str] | None = None) -> int:
    config = config_from_cli(EvaluateConfig, "python -m jobs.evaluate", __doc__.split("\n")[0], argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    from actors.agent_loop import ModelPolicy, run_episodes

    torch.set_num_threads(config.num_threads)
    tasks = config.tasks()
    start = time.perf_counter()
    policy = build_policy(config)
    try:
        results = run_episodes(lambda: make_env(config.env), tasks, policy, config.loop,
                               batch_size=config.batch_size, progress=f"eval {config.split}")
    finally:
        if isinstance(policy, ModelPolicy):
            policy.engine.close()
    wall_s = time.perf_counter() - start
    env = make_env(config.env)
    modes, periods = failure_modes(env, results), cycle_periods(env, results)
    summary = summarize(results, modes, periods)
    out = write_outputs(config, results, modes, periods, summary, wall_s)
    print(format_table(summary))
    if "tool_calls" in summary["overall"]:
        print("tool calls: " + " ".join(f"{name}:{n}" for name, n in summary["overall"]["tool_calls"].items()))
    print(f"policy={config.policy} split={config.split} episodes={len(results)} wall_s={wall_s:.1f} "
          f"results={out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
