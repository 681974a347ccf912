"""The judge-backend registry: `judge.backend: <name>` names one registered backend.

A backend scores a turn in [0, 1] (`judge.service.JudgeBackend`); its entry builds it inside the
judge's actor and says whether it can judge through a `judge.serve` model server. Adding one is
a module that calls `register_judge_backend` at import time; the shipped ones register in
`judge/builtin.py`. Nothing outside the registry tests a backend's name. The service actor
receives the entry itself, so a backend registered by the driver's code alone runs there too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from cluster.registry import Registry

if TYPE_CHECKING:
    from envs.registry import EnvConfig
    from judge.service import JudgeBackend, JudgeConfig
    from models.loading import ModelConfig


@dataclass(frozen=True)
class JudgeBackendEntry:
    build: Callable[["JudgeConfig", "ModelConfig", "EnvConfig"], "JudgeBackend"]
    """The backend, built where it runs from the judge section, the student's model config (its
    tokenizer decodes the episodes) and the job's environment."""
    served: Callable[["JudgeConfig", str, str], "JudgeConfig"] | None = None
    """The judge section pointed at a `judge.serve` server (its URL, its served model name); None:
    the backend cannot judge through one."""


REGISTRY: Registry[JudgeBackendEntry] = Registry("judge.backend", "judge backend", "judge.builtin")
"""The shipped backends register in `judge.builtin` (imported on the first lookup)."""


def register_judge_backend(name: str, entry: JudgeBackendEntry) -> None:
    """Make `judge.backend: <name>` build its services with `entry.build`."""
    REGISTRY.register(name, entry)


def judge_backend(name: str) -> JudgeBackendEntry:
    """The registered entry; ValueError naming the known ones when there is none."""
    return REGISTRY[name]
