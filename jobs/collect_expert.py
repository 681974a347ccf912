"""Collect an expert's trajectories τ* over a split, for TCOD-B2F (learner/curriculum.py).

    python -m jobs.collect_expert [--config FILE.yaml] [key.sub=value ...] [--dry-run]

Runs an expert on tasks `first_seed .. first_seed + num_tasks - 1` of `split`, at most
`max_turns` calls each: the environment's own expert (`policy=expert`, `TextEnv.expert()`: the
BabyAI bot), or a language model (`policy=model`: an LM teacher, e.g. one jobs.build_teacher
built, with its privileged context in `loop.privileged`) sampled `num_samples` times per task,
keeping the first success (pass@N). `job=JOB.yaml` takes the environment, turn limit and prompt
from a training job, and, when the job's teacher is a model, samples that teacher with its
privileged context: document 003's τ* are the teacher's own pass@10 successes. Writes `expert.parquet` (split, seed, task_type, success,
num_turns, calls as JSON strings) and `manifest.json` (the config, counts, success rate) to
`output_dir`. Failed tasks are kept and marked: B2F replays only successes and lets the
student play the rest alone. Use the same `env` section and turn limit as the training job.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from actors.agent_loop import LoopConfig
from actors.engine import SamplingConfig
from envs.registry import EnvSection, default_env_config
from jobs.config import config_from_cli
from models.loading import ModelConfig


class CollectExpertConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    job: str | None = None
    """A training job's config (the TCOD-B2F run's): its `env`, turn limit, prompt and parser are
    the defaults here, and when its teacher loads a model (hf, vllm), so are `policy=model`, the
    teacher's weights and privileged context (document 003 replays the teacher's own pass@10
    successes); with the oracle or no teacher, the environment's expert. Keys set here win."""
    env: EnvSection = Field(default_factory=default_env_config)
    split: str = "train"
    first_seed: int = Field(default=0, ge=0)
    num_tasks: int = Field(default=2000, ge=1)
    """Training workers draw seeds 0, 1, 2, ... of the train split: cover as many as the run will use."""
    max_turns: int = Field(default=20, ge=1)
    """The training loop's turn limit (rollout.loop.max_turns): a longer τ* could never be replayed."""
    output_dir: str = "runs/expert"
    policy: Literal["expert", "model"] = "expert"
    model: ModelConfig = ModelConfig()
    """The LM expert (policy=model); it must share the student's tokenizer only if it also scores."""
    engine: Literal["hf", "vllm"] = "vllm"
    num_samples: int = Field(default=10, ge=1)
    """pass@N of policy=model: attempts per task (document 003: 10)."""
    sampling: SamplingConfig = SamplingConfig(temperature=1.0, max_new_tokens=48, seed=0)
    loop: LoopConfig = LoopConfig()
    """Prompt, parser and privileged context of policy=model; its turn limit is `max_turns`."""
    batch_size: int = Field(default=32, ge=1)
    """Episodes of policy=model advanced together (one batched generation per turn)."""

    @model_validator(mode="before")
    @classmethod
    def _from_job(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not data.get("job"):
            return data
        from jobs.config import load_config
        from jobs.train import JobConfig
        from teacher.registry import teacher_backend

        job = load_config(JobConfig, data["job"])
        loop = job.rollout.loop
        defaults: dict[str, Any] = {"env": job.env.model_dump(mode="json"), "max_turns": loop.max_turns,
                                    "engine": job.rollout.engine}
        loop_defaults = {"prompt": loop.prompt.model_dump(mode="json"), "parser_mode": loop.parser_mode}
        teacher = job.teacher
        if teacher is not None and teacher_backend(teacher.backend).loads_model:
            defaults.update(policy="model", model=teacher.model.model_dump(mode="json"))
            loop_defaults["privileged"] = teacher.privileged.model_dump(mode="json")
        return {**defaults, **data, "loop": {**loop_defaults, **data.get("loop", {})}}

    @model_validator(mode="after")
    def _one_turn_limit(self) -> "CollectExpertConfig":
        if "max_turns" in self.loop.model_fields_set and self.loop.max_turns != self.max_turns:
            raise ValueError(f"loop.max_turns ({self.loop.max_turns}) differs from max_turns ({self.max_turns}): "
                             f"set max_turns only")
        return self


def collect(config: CollectExpertConfig, on_task=None) -> list[dict]:
    """One row per task: the expert's calls and whether they solved it."""
    from envs.registry import make_env

    env = make_env(config.env)
    if config.split not in env.splits:
        raise ValueError(f"split: environment {config.env.name!r} has no split {config.split!r}; "
                         f"its splits: {list(env.splits)}")
    if config.policy == "model":
        return collect_from_model(config, on_task)
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


def collect_from_model(config: CollectExpertConfig, on_task=None) -> list[dict]:
    """pass@N: `num_samples` sampled episodes per task, one row per task (`pass_at_n_row`)."""
    import torch

    from actors.agent_loop import EpisodeRunner, EpisodeTask, ModelPolicy
    from actors.rollout_worker import RolloutConfig, build_engine
    from envs.registry import make_env
    from models.loading import load_tokenizer

    torch.set_num_threads(1)
    tokenizer = load_tokenizer(config.model)
    loop = config.loop.model_copy(update={"max_turns": config.max_turns})
    engine = build_engine(RolloutConfig(engine=config.engine), config.model, tokenizer)
    policy = ModelPolicy(engine, tokenizer, config.sampling, loop)
    seeds = range(config.first_seed, config.first_seed + config.num_tasks)
    pending = [EpisodeTask(config.split, seed, index=i) for seed in seeds for i in range(config.num_samples)][::-1]
    attempts: dict[int, list] = {seed: [] for seed in seeds}
    runner = EpisodeRunner(lambda: make_env(config.env), config.batch_size, loop)
    try:
        while pending or runner.num_active:
            while pending and runner.num_free:
                task = pending.pop()
                runner.start(task, tag=task.seed)
            for seed, result in runner.step(policy):
                attempts[seed].append(result)
                if len(attempts[seed]) == config.num_samples and on_task is not None:
                    on_task()
    finally:
        engine.close()
    return [pass_at_n_row(results) for results in attempts.values()]


def pass_at_n_row(results: list) -> dict:
    """The row of one task from its attempts (EpisodeResults): the calls of the first success
    whose every turn executed a call (a replay cannot reproduce a turn that did nothing)."""
    solved = next((r for r in results if r.success and r.trajectory is not None
                   and all(t.executed_call is not None for t in r.trajectory.turns)), None)
    calls = [] if solved is None else [t.executed_call for t in solved.trajectory.turns]
    info = results[0].info
    return {"split": info.split, "seed": info.seed, "task_type": info.task_type, "success": solved is not None,
            "num_turns": len(calls), "calls": calls}


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
        "config": config.model_dump(mode="json"), "policy": config.policy,
        "num_samples": config.num_samples if config.policy == "model" else 1,
        "num_tasks": len(rows), "num_solved": num_solved,
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
