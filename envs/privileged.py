"""Privileged context c+: what a RetireOPD teacher reads and the student never sees (docs/algorithms.md §5).

c+ for one task is the skills a skill bank retrieves for its instruction (keyword match, as in
the seed) and, where the environment can describe it, a map of the task's full state at the
start (BabyAI: every object and door relative to the start pose -- what the expert bot knows and
the agent's egocentric view hides). It is appended to the system turn, after the tool list, so
the rest of the prompt -- and so the response tokens -- are the student's exactly.

One function renders it for both places that must agree byte for byte: the policy's own prompt
while a teacher is built (`LoopConfig.privileged`, `jobs.build_teacher`) and the teacher
service's rewrite of each student prompt (`teacher.privileged`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Protocol, runtime_checkable

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envs.protocol import EnvReset, TextEnv


class Skill(BaseModel):
    """One skill: shown when any keyword occurs in the task."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keywords: tuple[str, ...] = Field(min_length=1)
    text: str = Field(min_length=1)


class PrivilegedConfig(BaseModel):
    """Which privileged context c+ to show; all empty: none."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    skills: tuple[Skill, ...] = ()
    """Skills given inline."""
    skill_bank: str | None = None
    """A YAML or JSON file holding a list of skills ({keywords: [...], text: ...}), after the inline ones."""
    max_skills: int = Field(default=3, ge=1)
    """At most this many retrieved skills, in bank order."""
    map: bool = False
    """Also show the environment's map of the task at its start (environments with `privileged_map`)."""

    @property
    def enabled(self) -> bool:
        return bool(self.skills or self.skill_bank or self.map)


@runtime_checkable
class MapProvider(Protocol):
    """An environment that can describe the full state of the episode just reset."""

    def privileged_map(self) -> str:
        """The state the agent cannot observe, as text (one fact per line)."""
        ...


def load_skill_bank(path: str) -> list[Skill]:
    """Skills from a YAML or JSON list; ValueError naming the file and the bad entry."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"skill bank {path!r} does not exist")
    try:
        data = json.loads(file.read_text()) if file.suffix == ".json" else yaml.safe_load(file.read_text())
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"skill bank {path!r} is not valid {file.suffix.lstrip('.') or 'YAML'}: {exc}") from None
    if not isinstance(data, list) or not data:
        raise ValueError(f"skill bank {path!r} must hold a non-empty list of skills ({{keywords: [...], text: ...}})")
    skills = []
    for i, entry in enumerate(data):
        try:
            skills.append(Skill.model_validate(entry))
        except ValidationError as exc:
            raise ValueError(f"skill bank {path!r}, skill {i}: {exc.errors()[0]['msg']} "
                             f"({'.'.join(map(str, exc.errors()[0]['loc'])) or 'entry'})") from None
    return skills


class SkillBank:
    """Keyword retrieval over skills (whole words, case-insensitive), in bank order."""

    def __init__(self, skills: list[Skill], max_skills: int = 3) -> None:
        self.skills = list(skills)
        self.max_skills = max_skills
        self._patterns = [re.compile("|".join(rf"\b{re.escape(k.lower())}\b" for k in s.keywords)) for s in skills]

    def retrieve(self, task: str) -> list[Skill]:
        text = task.lower()
        return [s for s, p in zip(self.skills, self._patterns) if p.search(text)][: self.max_skills]


class PrivilegedContext:
    """Renders c+ for a task; `check(env)` before the first episode."""

    def __init__(self, config: PrivilegedConfig) -> None:
        self.config = config
        bank = list(config.skills) + (load_skill_bank(config.skill_bank) if config.skill_bank else [])
        self.bank = SkillBank(bank, config.max_skills)

    def check(self, env: TextEnv) -> None:
        if self.config.map and not isinstance(env, MapProvider):
            raise ValueError(f"privileged map: environment {type(env).__name__} has no map (no privileged_map "
                             f"method); set privileged.map=false")

    def text(self, env: TextEnv, reset: EnvReset) -> str:
        """c+ for the episode `env` was just reset to (`reset`); '' when nothing applies."""
        parts = []
        skills = self.bank.retrieve(reset.task)
        if skills:
            parts.append("Skills that help with this task:\n" + "\n".join(f"- {s.text}" for s in skills))
        if self.config.map:
            parts.append(env.privileged_map())
        return "".join("\n\n" + p for p in parts)
