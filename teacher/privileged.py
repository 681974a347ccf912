"""The teacher's prompts with privileged context c+ (envs.privileged, docs/algorithms.md §5).

The teacher prompt is the student's prompt with c+ appended to the system turn; the response
tokens stay the student's exact tokens. c+ is rendered by the same function that rendered the
teacher's own prompts while it was built (`jobs.build_teacher`), so it scores in the context it
was trained in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from buffer.contracts import Trajectory
from envs.privileged import PrivilegedConfig, PrivilegedContext
from envs.prompt import PromptConfig, system_content, template_tools
from envs.protocol import TextEnv
from envs.registry import EnvConfig


class TeacherPromptBuilder:
    """Builds teacher prompt ids from student prompt ids by swapping the system turn.

    The system turn is rendered as the student's prompter renders it (`prompt.tools`: schemas
    through the chat template, or the compact list in the system text); c+ follows it. A map
    needs the task's start state: the builder resets its own environment to (split, seed).
    """

    def __init__(self, tokenizer, env: TextEnv, context: PrivilegedContext,
                 prompt: PromptConfig = PromptConfig()) -> None:
        context.check(env)
        self.tokenizer = tokenizer
        self.env = env
        self.context = context
        self.prompt = prompt
        self._student_system = self._system_ids("")
        self._extra: dict[tuple[str, int], tuple[str, str]] = {}

    def _system_ids(self, extra: str) -> list[int]:
        content = system_content(self.prompt, self.env.system_prompt, self.env.tools) + extra
        tools: list[dict[str, Any]] | None = template_tools(self.prompt, self.env.tools)
        text = self.tokenizer.apply_chat_template([{"role": "system", "content": content}], tools=tools,
                                                  tokenize=False)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def privileged_text(self, trajectory: Trajectory) -> str:
        """c+ of the trajectory's task; ValueError when the teacher's environment gives another task."""
        key = (trajectory.split, trajectory.task_seed)
        if key not in self._extra:
            if len(self._extra) >= 4096:  # one entry per task: bounded, most tasks are not seen twice
                self._extra.clear()
            reset = self.env.reset(seed=trajectory.task_seed, split=trajectory.split)
            self._extra[key] = (reset.task, self.context.text(self.env, reset))
        task, text = self._extra[key]
        if trajectory.task and task != trajectory.task:
            raise ValueError(f"task {key} is {task!r} in the teacher's environment but the student played "
                             f"{trajectory.task!r}: the teacher must run the job's environment config")
        return text

    def teacher_prompt(self, student_prompt_ids: tuple[int, ...], trajectory: Trajectory) -> tuple[int, ...]:
        extra = self.privileged_text(trajectory)
        if not extra:
            return student_prompt_ids
        n = len(self._student_system)
        if tuple(student_prompt_ids[:n]) != tuple(self._student_system):
            raise ValueError("the student prompt does not start with the expected system turn; privileged context "
                             "needs the same system prompt and tools as the rollout")
        return tuple(self._system_ids(extra)) + tuple(student_prompt_ids[n:])


TEACHER_MANIFEST = "teacher.json"
"""Written next to a built teacher's weights by jobs.build_teacher: the c+, environment and
prompt it was trained with, and its success acting as a policy with c+ (SR_T)."""


def teacher_manifest(privileged: PrivilegedConfig, env: EnvConfig, prompt: PromptConfig) -> dict[str, Any]:
    """What a built teacher's prompts depend on: c+ (the skills as loaded, not the bank's path),
    the environment (tasks and maps) and the prompt format (the system turn c+ extends)."""
    context = PrivilegedContext(privileged)
    return {"skills": [s.model_dump(mode="json") for s in context.bank.skills], "max_skills": privileged.max_skills,
            "map": privileged.map, "env": env.model_dump(mode="json"), "prompt": prompt.model_dump(mode="json")}


def read_teacher_manifest(model_dir: Path) -> dict[str, Any] | None:
    path = Path(model_dir) / TEACHER_MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def check_built_teacher(model_dir: Path, privileged: PrivilegedConfig, env: EnvConfig,
                        prompt: PromptConfig) -> dict[str, Any] | None:
    """The manifest of a teacher built by jobs.build_teacher (None for any other model), checked
    against the job: a teacher scores well only in the context it was trained in."""
    manifest = read_teacher_manifest(model_dir)
    if manifest is None:
        return None
    expected = teacher_manifest(privileged, env, prompt)
    wrong = [key for key in expected if manifest[key] != expected[key]]
    if wrong:
        hint = {"skills": "teacher.privileged.skills / skill_bank", "max_skills": "teacher.privileged.max_skills",
                "map": "teacher.privileged.map", "env": "env", "prompt": "rollout.loop.prompt"}
        raise ValueError(f"teacher {str(model_dir)!r} was built with other " + ", ".join(
            f"{hint[k]} (built: {manifest[k]!r}; this job: {expected[k]!r})" for k in wrong)
            + "; its privileged context must be the one it was trained with")
    return manifest
