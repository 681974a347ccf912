"""Environments in their own processes: a Ray actor per environment, behind the `TextEnv` seam.

ALFWorld's TextWorld generates text in pure Python (about 9 steps/s per core, 1-3 s per game
load): in-process, a round's K environment steps run one after another between two generations.
With `rollout.env_actors: true` each of a worker's K environment slots is an actor, and the
episode runner submits every step (and every reset) of a round before it waits for any, so they
run concurrently, one process each:

    worker:  generate(K prompts) ──► submit K steps ──► wait all ──► generate(K prompts) ...
    actors:                          [env 0] [env 1] ... [env K-1]   (one process each)

A crashed environment actor is restarted by Ray (`rollout.env_max_restarts`); the call that saw
it die raises `EnvCrashed`, and the runner starts that episode over from its reset in the new
process (an episode is delivered only when it finishes, so it is neither lost nor recorded twice).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from envs.protocol import EnvCrashed, EnvReset, EnvStep, Expert, ToolCall
from envs.registry import EnvConfig


class _EnvActor:
    def __init__(self, config: EnvConfig) -> None:
        from envs.registry import make_env

        self.env = make_env(config)
        self._expert: Expert | None = None

    def describe(self) -> tuple[str, tuple[str, ...], tuple[str, ...], list[dict[str, Any]]]:
        return self.env.system_prompt, tuple(self.env.splits), tuple(self.env.task_types), self.env.tools

    def split_size(self, split: str) -> int | None:
        return self.env.split_size(split)

    def reset(self, seed: int, split: str) -> EnvReset:
        self._expert = None
        return self.env.reset(seed, split)

    def step(self, call: ToolCall) -> EnvStep:
        return self.env.step(call)

    def expert_act(self, executed: ToolCall | None) -> ToolCall | None:
        if self._expert is None:
            self._expert = self.env.expert()
            if self._expert is None:
                raise ValueError(f"environment {type(self.env).__name__} has no expert")
        return self._expert.act(executed)

    def pid(self) -> int:
        return os.getpid()


class RemoteEnv:
    """A `TextEnv` whose environment lives in its own actor; `submit_reset`/`submit_step` start a
    call and return a function that waits for it (the episode runner's concurrency)."""

    def __init__(self, config: EnvConfig, num_cpus: float = 0.0, max_restarts: int = 3) -> None:
        import ray

        self.actor = ray.remote(_EnvActor).options(num_cpus=num_cpus, max_restarts=max_restarts,
                                                   max_task_retries=0).remote(config)
        self.system_prompt, self.splits, self.task_types, self.tools = self._get(self.actor.describe.remote())

    @staticmethod
    def _get(ref):
        import ray

        try:
            return ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            raise EnvCrashed(f"the environment actor died: {exc}") from exc

    def _submit(self, method: str, *args) -> Callable[[], Any]:
        ref = getattr(self.actor, method).remote(*args)
        return lambda: self._get(ref)

    def split_size(self, split: str) -> int | None:
        return self._get(self.actor.split_size.remote(split))

    def reset(self, seed: int, split: str) -> EnvReset:
        return self.submit_reset(seed, split)()

    def submit_reset(self, seed: int, split: str) -> Callable[[], EnvReset]:
        return self._submit("reset", seed, split)

    def step(self, call: ToolCall) -> EnvStep:
        return self.submit_step(call)()

    def submit_step(self, call: ToolCall) -> Callable[[], EnvStep]:
        return self._submit("step", call)

    def expert(self) -> Expert:
        return _RemoteExpert(self)

    def pid(self) -> int:
        return self._get(self.actor.pid.remote())

    def close(self) -> None:
        import ray

        ray.kill(self.actor, no_restart=True)


class _RemoteExpert:
    """The expert of the episode running in the actor (it lives there, next to its environment)."""

    def __init__(self, env: RemoteEnv) -> None:
        self.env = env

    def act(self, executed: ToolCall | None) -> ToolCall | None:
        return self.env._get(self.env.actor.expert_act.remote(executed))
