"""Privileged context for the teacher: skills retrieved from a skill bank by keyword match.

RetireOPD (docs/algorithms.md §5) lets the teacher read context c+ the student never sees. The
teacher prompt is the student's prompt with the retrieved skills appended to the system
turn; the response tokens stay the student's exact tokens.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from envs.prompt import PromptConfig, system_content, template_tools


class Skill(BaseModel):
    """One skill: shown to the teacher when any keyword occurs in the task."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keywords: tuple[str, ...] = Field(min_length=1)
    text: str = Field(min_length=1)


class SkillBank:
    """Keyword retrieval over skills (whole words, case-insensitive), in bank order."""

    def __init__(self, skills: list[Skill], max_skills: int = 3) -> None:
        self.skills = list(skills)
        self.max_skills = max_skills
        self._patterns = [re.compile("|".join(rf"\b{re.escape(k.lower())}\b" for k in s.keywords)) for s in skills]

    def retrieve(self, task: str) -> list[Skill]:
        text = task.lower()
        return [s for s, p in zip(self.skills, self._patterns) if p.search(text)][: self.max_skills]


class TeacherPromptBuilder:
    """Builds teacher prompt ids from student prompt ids by swapping the system turn.

    The system turn is rendered as the student's prompter renders it (`prompt.tools`: schemas
    through the chat template, or the compact list in the system text); the skills follow it.
    """

    def __init__(self, tokenizer, system_prompt: str, tools: list[dict[str, Any]], bank: SkillBank,
                 prompt: PromptConfig = PromptConfig()) -> None:
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.tools = tools
        self.bank = bank
        self.prompt = prompt
        self._student_system = self._system_ids("")

    def _system_ids(self, extra: str) -> list[int]:
        content = system_content(self.prompt, self.system_prompt, self.tools) + extra
        text = self.tokenizer.apply_chat_template([{"role": "system", "content": content}],
                                                  tools=template_tools(self.prompt, self.tools), tokenize=False)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def teacher_prompt(self, student_prompt_ids: tuple[int, ...], task: str) -> tuple[int, ...]:
        skills = self.bank.retrieve(task)
        if not skills:
            return student_prompt_ids
        n = len(self._student_system)
        if tuple(student_prompt_ids[:n]) != tuple(self._student_system):
            raise ValueError("the student prompt does not start with the expected system turn; privileged context "
                             "needs the same system prompt and tools as the rollout")
        skills_text = "\n\nSkills that help with this task:\n" + "\n".join(f"- {s.text}" for s in skills)
        return tuple(self._system_ids(skills_text)) + tuple(student_prompt_ids[n:])
