"""The environment registry: a job's `env: {name: ..., ...}` section names one registered `TextEnv`.

Every place that builds an environment (rollout workers, evaluation, the warm start's
demonstrations, the oracle teacher's replays) calls `make_env` on the same validated config,
so they all play the same tasks. Adding an environment is one module that calls
`register_env` at import time, plus its module path in `BUILTIN_ENVS` (or an import of that
module before the config is validated, as a test does).

    env = make_env(parse_env_config({"name": "babyai_text", "room_size": 6}))

A section without `name` means `DEFAULT_ENV`, so `env.room_size=6` overrides the default.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Annotated, Any, Callable

from pydantic import BaseModel, BeforeValidator, ConfigDict, SerializeAsAny

from envs.protocol import TextEnv

DEFAULT_ENV = "babyai_text"
BUILTIN_ENVS: dict[str, str] = {"babyai_text": "envs.babyai_text", "alfworld": "envs.alfworld",
                                 "scienceworld": "envs.scienceworld", "gateway": "envs.gateway"}
"""Registered environments that ship with the project -> the module that registers each (imported on first use)."""


class EnvConfig(BaseModel):
    """Base of every environment's config: `name` selects the registered environment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str

    def check_rollout(self, rollout: Any) -> None:
        """ValueError naming the `rollout` setting (a `RolloutConfig`) this environment cannot run with."""


@dataclass(frozen=True)
class EnvEntry:
    config_cls: type[EnvConfig]
    factory: Callable[[Any], TextEnv]
    runner: str | None = None
    """`module:Class` of the episode runner that plays this environment's episodes in place of
    `actors.agent_loop.EpisodeRunner` (the gateway: its episodes are driven by programs)."""


_REGISTRY: dict[str, EnvEntry] = {}


def register_env(name: str, config_cls: type[EnvConfig], factory: Callable[[Any], TextEnv],
                 runner: str | None = None) -> None:
    """Make `env.name: <name>` build `factory(config)` with `config` a validated `config_cls`;
    `runner`: see `EnvEntry.runner` (a path, so this bottom layer imports no actor code)."""
    entry = EnvEntry(config_cls, factory, runner)
    if name in _REGISTRY and _REGISTRY[name] != entry:
        raise ValueError(f"environment {name!r} is already registered")
    if config_cls.model_fields["name"].default != name:
        raise ValueError(f"{config_cls.__name__}.name must default to {name!r}")
    _REGISTRY[name] = entry


def known_envs() -> list[str]:
    return sorted(set(_REGISTRY) | set(BUILTIN_ENVS))


def _entry(name: str) -> EnvEntry:
    if name not in _REGISTRY and name in BUILTIN_ENVS:
        importlib.import_module(BUILTIN_ENVS[name])
    if name not in _REGISTRY:
        raise ValueError(f"env.name: unknown environment {name!r}; known environments: {known_envs()}")
    return _REGISTRY[name]


def parse_env_config(value: Any) -> EnvConfig:
    """A mapping (or an EnvConfig) as the config class its `name` registered."""
    if isinstance(value, EnvConfig):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"env must be a mapping with a `name` (one of {known_envs()}), got {value!r}")
    name = value.get("name", DEFAULT_ENV)
    if not isinstance(name, str):
        raise ValueError(f"env.name must be a string (one of {known_envs()}), got {name!r}")
    return _entry(name).config_cls.model_validate({**value, "name": name})


def default_env_config() -> EnvConfig:
    return parse_env_config({"name": DEFAULT_ENV})


EnvSection = Annotated[SerializeAsAny[EnvConfig], BeforeValidator(parse_env_config)]
"""The type of a config field that holds an environment section (dumps every field of the subclass)."""


def make_env(config: EnvConfig) -> TextEnv:
    """A new environment instance of the registered kind."""
    return _entry(config.name).factory(config)


def env_runner(config: EnvConfig) -> str | None:
    """`module:Class` of the runner registered for this environment; None: the built-in agent loop."""
    return _entry(config.name).runner


def check_split(config: EnvConfig, split: str, key: str) -> None:
    """ValueError naming `key` when the environment has no such split."""
    splits = make_env(config).splits
    if split not in splits:
        raise ValueError(f"{key}: environment {config.name!r} has no split {split!r}; its splits: {list(splits)}")
