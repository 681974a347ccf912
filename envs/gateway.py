"""The `gateway` environment: episodes are runs of a user's agent program (docs/gateway.md).

The program talks to an OpenAI-compatible endpoint served by the rollout worker from its own
engine (actors/gateway.py) and ends its session with a reward; the worker records every call
token for token and turns the session into a `Trajectory`. What the program solves comes from
a second environment, `tasks`: its splits, task types and (split, seed) tasks, and its expert for
the oracle teacher, the turn judge and warm-start demonstrations. The environment object below
is that task environment under the gateway's config, so every part of a job that builds the
job's environment (evaluation's split checks, the oracle's replays) sees the tasks.

    env: {name: gateway, command: "python examples/gateway_agent.py",
          tasks: {name: babyai_text, room_size: 6}}

The oracle teacher and the judge replay a trajectory's `executed_call`s in the task
environment: the gateway records, as a turn's executed call, the tool call it returned to the
program, so they assume the program executes the calls it receives (the example does).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from envs.protocol import EnvReset, EnvStep, Expert, TextEnv, ToolCall
from envs.registry import EnvConfig, EnvSection, default_env_config, make_env, register_env


class GatewayConfig(EnvConfig):
    """A user program as the agent, behind the rollout engine's OpenAI-compatible endpoint."""

    name: str = "gateway"
    tasks: EnvSection = Field(default_factory=default_env_config)
    """The environment whose tasks the program solves (its splits, task types and expert)."""
    command: str | None = None
    """A shell command run once per session, in the rollout worker's working directory and with its
    Python first on PATH (`python -m my_agent` runs in the job's environment), with OPENAI_BASE_URL
    (this session's endpoint), OPENAI_API_KEY, APPRENTICE_GATEWAY_URL, APPRENTICE_SESSION_ID and
    APPRENTICE_TASK (JSON: split, seed, task, task_type, max_turns, env) in its environment."""
    persistent: bool = False
    """Run the command once per slot instead of once per session: it reads one session per line on
    stdin (JSON: session_id, base_url, gateway_url, api_key, task), posts its reward, then reads the
    next; one that fails a session is killed and started again for the slot's next. Saves the
    program's start per episode (1-1.5 s of CPU for a Python agent that imports `openai`)."""
    callable: str | None = None
    """`module:function` called once per session on a thread of the rollout worker with one
    `actors.gateway.Session` (the same facts as the command's variables)."""
    host: str = "127.0.0.1"
    """Where each worker's endpoint listens (loopback unless configured)."""
    port: int = Field(default=0, ge=0, le=65535)
    """0: a free port per endpoint (each worker serves one for rollout and one per evaluation)."""
    api_key: str | None = "auto"
    """Calls without `Authorization: Bearer <key>` are refused (401). 'auto': a random key per
    endpoint, given to the programs; None: no key asked."""
    session_timeout_s: float = Field(default=300.0, gt=0)
    """A session still open this long after its program started ends as a failure, its program killed."""
    batch_window_s: float = Field(default=0.05, ge=0)
    """Once a call is in, a generation round waits for the other sessions' next calls while they
    keep coming (no gap longer than this; at most the last generation's time), so calls batch like
    the built-in loop's rounds; a session whose program is busy sits the round out. 0: no wait."""

    @model_validator(mode="after")
    def _one_program(self) -> "GatewayConfig":
        if (self.command is None) == (self.callable is None):
            raise ValueError("env (gateway): set exactly one of env.command (a shell command) and env.callable "
                             "(module:function) -- the program each session runs")
        if self.persistent and self.command is None:
            raise ValueError("env.persistent runs env.command once per slot: set env.command")
        if self.callable is not None and ":" not in self.callable:
            raise ValueError(f"env.callable must be 'module:function', got {self.callable!r}")
        if self.tasks.name == self.name:
            raise ValueError("env.tasks must name the environment whose tasks the program solves, not the gateway")
        return self

    def check_rollout(self, rollout: Any) -> None:
        loop = rollout.loop
        for off, why in [(rollout.env_actors, "rollout.env_actors: the program holds its environment"),
                         (loop.working_memory, "rollout.loop.working_memory: the program writes its own prompts"),
                         (loop.privileged.enabled, "rollout.loop.privileged: the program writes its own prompts")]:
            if off:
                raise ValueError(f"{why}; turn it off with env.name=gateway")


class GatewayEnv:
    """The task environment, carrying the gateway's config (`TextEnv` by delegation)."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.tasks: TextEnv = make_env(config.tasks)
        self.system_prompt = self.tasks.system_prompt
        self.splits = self.tasks.splits

    @property
    def task_types(self) -> tuple[str, ...]:
        return self.tasks.task_types

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self.tasks.tools

    def split_size(self, split: str) -> int | None:
        return self.tasks.split_size(split)

    def reset(self, seed: int, split: str) -> EnvReset:
        return self.tasks.reset(seed, split)

    def step(self, call: ToolCall) -> EnvStep:
        return self.tasks.step(call)

    def expert(self) -> Expert | None:
        return self.tasks.expert()

    def recover(self, text: str) -> ToolCall | None:
        return self.tasks.recover(text)


register_env("gateway", GatewayConfig, GatewayEnv, runner="actors.gateway:GatewayRunner")
