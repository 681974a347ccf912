"""Environments in their own processes: a Ray actor per environment, behind the `TextEnv` seam.

ALFWorld's TextWorld generates text in pure Python (about 9 steps/s per core, 1-3 s per game
load): in-process, a round's K environment steps (and game loads) run one after another between
two generations. With `rollout.env_actors: true` each of a worker's K environment slots is an
actor; the episode runner submits a round's calls before it waits for any, and an episode whose
environment has not answered sits the next round out instead of holding the batch back:

    worker:  generate(ready episodes) ─► submit their steps ─► take in the answers that are in ─► generate ...
    actors:  [env 0: step] [env 1: loading a game ......] [env 2: step] ...   (one process each)

A crashed environment actor is restarted by Ray (`rollout.env_max_restarts`); the call that saw
it die raises `EnvCrashed`, and the runner starts that episode over from its reset in the new
process (an episode is delivered only when it finishes, so it is neither lost nor recorded twice).
"""

from __future__ import annotations

import os
import time
from typing import Any

from actors.agent_loop import Pending
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

    def reset(self, seed: int, split: str) -> tuple[EnvReset, int]:
        """The reset and this process's pid: later calls name it, so a call that reaches a
        restarted process (which never saw the episode) fails as a crash."""
        self._expert = None
        return self.env.reset(seed, split), os.getpid()

    def _check(self, pid: int) -> None:
        if pid != os.getpid():
            raise EnvCrashed(f"the episode's environment process {pid} was restarted as {os.getpid()}")

    def step(self, call: ToolCall, pid: int) -> EnvStep:
        self._check(pid)
        return self.env.step(call)

    def recover(self, text: str, pid: int) -> ToolCall | None:
        self._check(pid)
        return self.env.recover(text)

    def expert_act(self, executed: ToolCall | None, pid: int) -> ToolCall | None:
        self._check(pid)
        if self._expert is None:
            self._expert = self.env.expert()
            if self._expert is None:
                raise ValueError(f"environment {type(self.env).__name__} has no expert")
        return self._expert.act(executed)

    def pid(self) -> int:
        return os.getpid()


class RemoteEnv:
    """A `TextEnv` whose environment lives in its own actor; `submit_reset`/`submit_step` start a
    call and return it in flight (`Pending`), so the episode runner can go on without it."""

    def __init__(self, config: EnvConfig, num_cpus: float = 0.0, max_restarts: int = 3,
                 scheduling_strategy: Any = "DEFAULT", call_timeout_s: float = 120.0) -> None:
        """`scheduling_strategy`: the plan's bundle for this actor (cluster.plan, role `env`);
        `call_timeout_s`: a call not answered within it finds the actor hung (`_get`)."""
        import ray

        self.call_timeout_s = call_timeout_s
        self.actor = ray.remote(_EnvActor).options(num_cpus=num_cpus, max_restarts=max_restarts, max_task_retries=0,
                                                   scheduling_strategy=scheduling_strategy).remote(config)
        # Its first answer waits for the process to start (imports, the environment's data): no deadline.
        self.system_prompt, self.splits, self.task_types, self.tools = self._get(self.actor.describe.remote(),
                                                                                 deadline=False)
        self._pid = -1
        """The process of the episode's reset (calls to another process fail as a crash)."""

    def _get(self, ref, deadline: bool = True):
        """The call's result; EnvCrashed when the actor died, or (with `deadline`) did not answer
        within `call_timeout_s` -- then it is hung: killed, and Ray restarts it like a crashed one."""
        import ray

        try:
            return ray.get(ref, timeout=self.call_timeout_s if deadline else None)
        except ray.exceptions.GetTimeoutError:
            ray.kill(self.actor, no_restart=False)
            self._restarted()
            raise EnvCrashed(f"the environment actor did not answer within {self.call_timeout_s} s: killed as hung "
                             f"and restarted") from None
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            raise EnvCrashed(f"the environment actor died: {exc}") from exc
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, EnvCrashed):
                raise exc.cause from None
            raise

    def _restarted(self, num_tries: int = 20) -> None:
        """Return once the incarnation after a kill answers (its start is no hang: the next call's
        deadline counts from here); EnvCrashed when it never comes back (its restarts are spent)."""
        import ray

        for _ in range(num_tries):
            try:
                ray.get(self.actor.__ray_ready__.remote())
                return
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                time.sleep(0.5)
        raise EnvCrashed("the environment actor did not come back after it was killed as hung")

    def _submit(self, method: str, *args) -> Pending:
        import ray

        ref = getattr(self.actor, method).remote(*args)
        return Pending(lambda: self._get(ref), lambda: bool(ray.wait([ref], timeout=0)[0]))

    def split_size(self, split: str) -> int | None:
        return self._get(self.actor.split_size.remote(split))

    def reset(self, seed: int, split: str) -> EnvReset:
        return self.submit_reset(seed, split).wait()

    def submit_reset(self, seed: int, split: str) -> Pending:
        pending = self._submit("reset", seed, split)

        def wait() -> EnvReset:
            reset, self._pid = pending.wait()
            return reset

        return Pending(wait, pending.ready)

    def step(self, call: ToolCall) -> EnvStep:
        return self.submit_step(call).wait()

    def submit_step(self, call: ToolCall) -> Pending:
        return self._submit("step", call, self._pid)

    def recover(self, text: str) -> ToolCall | None:
        return self._get(self.actor.recover.remote(text, self._pid))

    def expert(self) -> Expert:
        return _RemoteExpert(self)

    def pid(self) -> int:
        return self._get(self.actor.pid.remote())

    def episode_lost(self) -> bool:
        """Whether the process that reset the running episode is gone (dead or restarted)."""
        try:
            return self.pid() != self._pid
        except EnvCrashed:
            return True


class _RemoteExpert:
    """The expert of the episode running in the actor (it lives there, next to its environment)."""

    def __init__(self, env: RemoteEnv) -> None:
        self.env = env

    def act(self, executed: ToolCall | None) -> ToolCall | None:
        return self.env._get(self.env.actor.expert_act.remote(executed, self.env._pid))
