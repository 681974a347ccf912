"""A preset in miniature: the production job's structure at CPU size, the step before a GPU run.

    python -m jobs.train --config jobs/configs/babyai_opd_qwen3_gpu8.yaml --miniature [--keep-gpus] [key=value ...]

What stays as the preset says: the plan's roles and bundle counts, the algorithm and its
settings, the group size, model and engine dtypes (bf16 stays bf16), the staleness bound, the
teachers (backend, privileged context, top-k), the judge, the environment and its splits, the
engines (vLLM stays vLLM). So the run goes through the code the GPU run executes: placement
groups, learner rendezvous, mixed precision, bf16 publish to the engines, checkpoints, resume
and the HF export.

What shrinks: every model becomes a tiny Qwen3 of the same layout (the student `tiny:nano`,
teachers and judges `tiny:tiny`, one tokenizer), vLLM contexts and KV caches, episodes (turns, tokens),
environments per worker, the batch, the run (2 steps, an evaluation and a checkpoint at step 2);
groups without reward variance are kept (a random tiny student fails every episode alike, and
GRPO-style algorithms would otherwise drop every group and never step).
A teacher built by `jobs.build_teacher` (RetireOPD) has no manifest in miniature, so its SR_T
is taken as 1.0 unless the preset sets it. GPUs: by default the miniature turns each bundle's GPUs
into a share of the CPUs, so the job fits the embedded 2-CPU node; `--keep-gpus` keeps the preset's
GPU counts as Ray resources, for a cluster that declares them (a real one, or the simulated
multi-node cluster of the tests, where each actor still finds no CUDA and runs on CPU with
gloo). Values given on the command line win over the miniature's.

A remote teacher stays remote: its server must be reachable (benchmarks/miniatures.py serves
the tiny teacher with `models.vllm_server` and points `teacher.remote.url` at it).
"""

from __future__ import annotations

from typing import Any, Literal

from cluster.plan import ROLES, RolePlan
from learner.algorithms import parse_algorithm_config
from teacher.registry import teacher_backend

MiniatureGpus = Literal["cpu", "gpus"]

STUDENT, TEACHER = "tiny:nano", "tiny:tiny"
"""Tiny Qwen3 models with one tokenizer (the tiny tokenizer depends on the seed, not the size):
the teacher is the larger, as in the presets."""
CONTEXT_TOKENS = 2048
"""vLLM max_model_len and the loop's context budget in miniature (the tiny model's window is 4096)."""
CPU_SHARE = 0.9
"""Share of the cluster's CPUs the miniature's bundles reserve (the buffer and the driver's
actors take the rest)."""


def _model(model: dict[str, Any], path: str = STUDENT) -> dict[str, Any]:
    """A tiny model in the same dtype."""
    return {**model, "path": path}


def _vllm(vllm: dict[str, Any]) -> dict[str, Any]:
    """The same engine settings at CPU size: a short context, eager (no graph capture), the engine
    core in-process (half the start of each of the plan's engines, for a 2-step run)."""
    return {**vllm, "max_model_len": min(vllm.get("max_model_len", CONTEXT_TOKENS), CONTEXT_TOKENS),
            "enforce_eager": True, "cpu_kv_cache_gib": 1, "in_process": True}


def _teacher(teacher: dict[str, Any] | None) -> dict[str, Any] | None:
    if teacher is None or not teacher_backend(teacher["backend"]).loads_model:
        return teacher
    return {**teacher, "model": _model(teacher["model"], TEACHER), "vllm": _vllm(teacher["vllm"]),
            "max_batch_tokens": min(teacher["max_batch_tokens"], 8192)}


def _plan(plan: dict[str, Any], num_cpus: float, gpus: MiniatureGpus) -> dict[str, Any]:
    """Each reserving role keeps its count (and, with `gpus`, its GPUs); CPUs are shared out evenly
    over the bundles so the whole plan takes CPU_SHARE of `num_cpus`."""
    reserving = {name: plan[name] for name in ROLES if RolePlan(**plan[name]).reserves}
    num_bundles = sum(role["count"] for role in reserving.values())
    share = int(CPU_SHARE * num_cpus / max(num_bundles, 1) * 1000) / 1000
    return {**plan, "preset": "custom", **{name: {**role, "cpus": share, "gpus": role["gpus"] if gpus == "gpus" else 0.0}
                                           for name, role in reserving.items()}}


def miniature(data: dict[str, Any], num_cpus: float | None = None, gpus: MiniatureGpus = "cpu") -> dict[str, Any]:
    """The resolved config `data` (`JobConfig.model_dump()`) of a preset, in miniature.

    `num_cpus`: the CPUs the plan's bundles share (at most CPU_SHARE of them); default the
    config's `cluster.num_cpus` (the embedded node's, 2 unless set)."""
    num_cpus = data["cluster"]["num_cpus"] if num_cpus is None else num_cpus
    out = dict(data)
    out["model"] = _model(data["model"])
    rollout = data["rollout"]
    loop = rollout["loop"]
    num_envs = max(rollout["group_size"], 2)
    out["rollout"] = {
        **rollout, "num_envs": num_envs, "vllm": _vllm(rollout["vllm"]),
        "sampling": {**rollout["sampling"], "max_new_tokens": min(rollout["sampling"]["max_new_tokens"], 24)},
        "loop": {**loop, "max_turns": min(loop["max_turns"], 4),
                 "max_context_tokens": min(loop["max_context_tokens"], CONTEXT_TOKENS)},
    }
    out["teacher"] = _teacher(data["teacher"])
    out["teacher_routes"] = [{**route, "teacher": _teacher(route["teacher"])} for route in data["teacher_routes"]]
    if data["judge"] is not None and data["judge"]["serve"] is not None:
        serve = data["judge"]["serve"]
        out["judge"] = {**data["judge"], "serve": {**serve, "model": _model(serve["model"], TEACHER),
                                                   "max_model_len": min(serve["max_model_len"], CONTEXT_TOKENS)},
                        "http": {**data["judge"]["http"], "max_tokens": min(data["judge"]["http"]["max_tokens"], 64)}}
    # A random tiny student fails every episode alike: groups without reward variance carry the
    # whole batch, or GRPO-style algorithms would drop them all and never take a step.
    model_teacher = out["teacher"] is not None and teacher_backend(out["teacher"]["backend"]).loads_model
    algorithm = parse_algorithm_config({**data["learner"]["algorithm"], "drop_zero_variance_groups": False})
    algorithm = algorithm.miniature(model_teacher).model_dump(mode="json")
    out["learner"] = {**data["learner"], "algorithm": algorithm, "warmup_steps": min(data["learner"]["warmup_steps"], 1),
                      "micro_batch_tokens": min(data["learner"]["micro_batch_tokens"], 8192)}
    out["buffer"] = {**data["buffer"], "batch_size": min(data["buffer"]["batch_size"], 2 * num_envs),
                     "capacity_samples": min(data["buffer"]["capacity_samples"], 4096)}
    out["warm_start"] = {**data["warm_start"], "num_episodes": 0}
    cluster = data["cluster"]
    env_count = cluster["plan"]["env"]["count"]
    plan = cluster["plan"]
    if env_count:  # a rollout worker's environment actors follow its (smaller) num_envs
        plan = {**plan, "env": {**plan["env"], "count": plan["rollout"]["count"] * num_envs * 2}}
    out["cluster"] = {**cluster, "plan": _plan(plan, num_cpus, gpus)}
    run = data["run"]
    out["run"] = {**run, "dir": f"{run['dir'].rstrip('/')}-miniature", "steps": 2, "eval_every": 2,
                  "eval_tasks": 2, "checkpoint_every": 2, "batch_timeout_s": min(run["batch_timeout_s"], 600.0)}
    return out
