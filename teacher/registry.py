"""The teacher-backend registry: `teacher.backend: <name>` names one registered backend.

A backend is what scores the student's tokens: a builder of the `TrajectoryScorer` the teacher
service runs, plus the few facts the job checks before any actor starts (does it load
`teacher.model` where it runs, does it score any text, what it reaches and how long a context it
accepts). Adding one is a module that calls `register_teacher_backend` at import time; the
built-in ones register in `teacher/builtin.py`. Nothing outside the registry tests a backend's
name.

    register_teacher_backend("echo", TeacherBackendEntry(build=lambda config, ctx: EchoScorer()))

The service actor receives the entry itself (`create_teacher_service`), so a backend registered
by the driver's code alone (a test file, a user's script) runs in the actor's process too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from cluster.registry import Registry

if TYPE_CHECKING:
    from envs.prompt import PromptConfig
    from envs.protocol import TextEnv
    from teacher.service import TeacherConfig, TrajectoryScorer


@dataclass(frozen=True)
class BuildContext:
    """What a backend is built with, inside the service's actor, besides its config section."""

    student_tokenizer: Any
    """The student's tokenizer (a transformers tokenizer): the tokens every score is about."""
    env: "TextEnv"
    """The job's environment (the oracle replays its tasks; privileged context reads its prompts)."""
    prompt: "PromptConfig"
    """The rollout's prompt config (privileged context rewrites the system turn the way it renders)."""


@dataclass(frozen=True)
class TeacherBackendEntry:
    build: Callable[["TeacherConfig", BuildContext], "TrajectoryScorer"]
    """The scorer of one service, built where it runs; checks its tokenizer before anything is scored."""
    loads_model: bool = False
    """It loads `teacher.model` where it runs: the job fetches the weights and checks the tokenizer
    and a built teacher's manifest before any actor starts, and the service needs a resource
    bundle of its own (so it cannot be a routed teacher)."""
    scores_text: bool = True
    """A language model that scores any text, memory turns included, and can take privileged context
    (False: the oracle, which scores tool calls against the environment's expert)."""
    check: Callable[["TeacherConfig", Any], int | None] | None = None
    """Preflight of what the backend reaches (a server), given the student's tokenizer; raises
    ValueError naming the problem, returns the longest context it accepts (None: no limit known)."""
    context_limit: Callable[["TeacherConfig"], tuple[str, int] | None] = lambda config: None
    cross_tokenizer: bool = False
    """It honours `teacher.cross_tokenizer` (a teacher with a tokenizer of its own)."""
    """(config key, tokens): the longest prompt + response its config lets it score, checked against
    rollout.loop.max_context_tokens before any actor starts."""


REGISTRY: Registry[TeacherBackendEntry] = Registry("teacher.backend", "teacher backend", "teacher.builtin")
"""The shipped backends register in `teacher.builtin` (imported on the first lookup)."""


def register_teacher_backend(name: str, entry: TeacherBackendEntry) -> None:
    """Make `teacher.backend: <name>` build its services with `entry.build`."""
    REGISTRY.register(name, entry)


def teacher_backend(name: str) -> TeacherBackendEntry:
    """The registered entry; ValueError naming the known ones when there is none."""
    return REGISTRY[name]
