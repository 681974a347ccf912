"""BabyAI-Text MixedTrainLocal as a `TextEnv` driven by six argument-free tools."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from minigrid.envs.babyai.core.roomgrid_level import RoomGridLevel
from pydantic import ConfigDict, Field, field_validator

from envs.babyai_text.level import NUM_DISTRACTORS, ROOM_SIZE, MixedTrainLocalLevel, num_rooms
from envs.babyai_text.tasks import SPLITS, TASK_TYPES, split_size, task_spec
from envs.babyai_text.text_obs import ObservationOrder, describe, describe_map, recalled, seen_cells
from envs.protocol import EnvReset, EnvStep, Expert, TaskInfo, ToolCall
from envs.registry import EnvConfig
from envs.tools import function_tool

ACTION_TOOLS: tuple[tuple[str, str], ...] = (
    ("turn_left", "Turn 90 degrees to the left."),
    ("turn_right", "Turn 90 degrees to the right."),
    ("go_forward", "Move one step forward, if the cell in front is free."),
    ("pick_up", "Pick up the object right in front of you; you can carry one object."),
    ("drop", "Drop the object you carry onto the free cell in front of you."),
    ("toggle", "Open or close the door right in front of you; a locked door opens only while you carry its key."),
)
"""Tool names in minigrid action order (turn_left is action 0, toggle is action 5)."""
TOOL_TO_ACTION: dict[str, int] = {name: i for i, (name, _) in enumerate(ACTION_TOOLS)}
ACTION_TO_TOOL: dict[int, str] = {i: name for name, i in TOOL_TO_ACTION.items()}
BABYAI_TOOLS: list[dict[str, Any]] = [function_tool(name, desc) for name, desc in ACTION_TOOLS]

SYSTEM_PROMPT = (
    "You are an agent in a grid world. You see what lies in front of you and to your sides, "
    "and you act by calling exactly one tool per turn. Objects are keys, balls and boxes; "
    "doors may be open, closed or locked. You cannot walk through walls, objects or closed doors. "
    "To go to an object, stand right in front of it, facing it. To put an object next to another, "
    "pick it up, face a free cell next to the other object and drop it. "
    "Answer with one tool call and nothing else."
)


class BabyAITextConfig(EnvConfig):
    """Settings of the BabyAI-Text environment; the defaults are the study's MixedTrainLocal level."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal["babyai_text"] = "babyai_text"
    task_types: tuple[str, ...] = Field(default=TASK_TYPES, min_length=1)
    task_sampling: Literal["uniform", "balanced"] = "uniform"
    room_size: int = Field(default=ROOM_SIZE, ge=5, le=16)
    """Cells per room side, walls included (minigrid's room_size); 6 leaves a 4x4 floor."""
    num_distractors: int = Field(default=NUM_DISTRACTORS, ge=0, le=20)
    """Objects placed besides the ones the instruction names."""
    max_generation_attempts: int = Field(default=1000, ge=1)
    observation_order: ObservationOrder = "scan"
    """Order of the observation's sentences: `scan`, BabyAI-Text's (the study's); `nearest`, by
    steps from the agent, the cell in front first (envs.babyai_text.text_obs, docs/babyai_text.md)."""
    observation_memory: bool = False
    """After the view, the objects and doors seen earlier in the episode and out of view now, at the
    cell where each was last seen relative to the agent's pose ("You remember a red ball 1 step left
    and 2 steps back"): the agent's own past views, so a policy without the history in its prompt
    can go back to what it saw (envs.babyai_text.text_obs, docs/babyai_text.md, "Remembered objects")."""
    expert_deviation: Literal["undo", "replan"] = "undo"
    """The bot's advice after a call it did not suggest (the oracle teacher's and judge's labels on
    a student's own paths): `undo` plans to undo the call first (minigrid's bot), `replan` plans
    afresh from the state reached (envs.babyai_text.expert, docs/babyai_text.md)."""

    @field_validator("task_types")
    @classmethod
    def _known_types(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [t for t in value if t not in TASK_TYPES]
        if unknown:
            raise ValueError(f"unknown task type(s) {unknown}; known: {list(TASK_TYPES)}")
        if len(set(value)) != len(value):
            raise ValueError(f"task_types has duplicates: {list(value)}")
        return value


class BabyAITextEnv:
    """One BabyAI-Text episode at a time; reusable across resets (one level per room count)."""

    system_prompt = SYSTEM_PROMPT
    splits = SPLITS

    def __init__(self, config: BabyAITextConfig | None = None) -> None:
        self.config = config or BabyAITextConfig()
        self._levels: dict[int, MixedTrainLocalLevel] = {}
        self._level: MixedTrainLocalLevel | None = None
        self._done = True
        self._info: TaskInfo | None = None
        self._memory: dict[tuple[int, int], str] = {}

    @property
    def tools(self) -> list[dict[str, Any]]:
        return BABYAI_TOOLS

    @property
    def task_types(self) -> tuple[str, ...]:
        return tuple(self.config.task_types)

    @property
    def level(self) -> RoomGridLevel:
        """The minigrid level of the current episode (the expert bot reads it)."""
        if self._level is None:
            raise RuntimeError("no episode yet: call reset() first")
        return self._level

    @property
    def task_info(self) -> TaskInfo:
        if self._info is None:
            raise RuntimeError("no episode yet: call reset() first")
        return self._info

    def split_size(self, split: str) -> int | None:
        return split_size(split)

    def reset(self, seed: int, split: str = "train") -> EnvReset:
        spec = task_spec(split, seed, self.config.task_types, self.config.task_sampling)
        rooms = num_rooms(spec.task_type)
        level = self._levels.get(rooms)
        if level is None:
            level = MixedTrainLocalLevel(num_cols=rooms, max_attempts=self.config.max_generation_attempts,
                                         room_size=self.config.room_size,
                                         num_distractors=self.config.num_distractors)
            self._levels[rooms] = level
        level.task_type = spec.task_type
        obs, _ = level.reset(seed=spec.level_seed)
        self._level = level
        self._memory = {}
        self._done = False
        self._info = TaskInfo(split=split, seed=seed, task_type=spec.task_type, max_steps=level.max_steps)
        return EnvReset(task=level.mission, observation=self._observation(obs), info=self._info)

    def step(self, call: ToolCall) -> EnvStep:
        if self._done:
            raise RuntimeError("the episode is over: call reset() before step()")
        action = TOOL_TO_ACTION.get(call.name)
        if action is None:
            raise ValueError(f"unknown tool {call.name!r}; known: {list(TOOL_TO_ACTION)}")
        if call.arguments:
            raise ValueError(f"tool {call.name!r} takes no arguments, got {call.arguments}")
        return self.step_action(action)

    def recover(self, text: str) -> ToolCall | None:
        """Nothing beyond the parser's fallback: every BabyAI tool is argument-free, so a tool named
        in the tail is already recovered there."""
        return None

    def failure_mode(self, split: str, seed: int, calls: Sequence[ToolCall | None]) -> str | None:
        """Where the episode (split, seed) that executed `calls` failed (envs.babyai_text.diagnosis;
        resets this environment); None when it succeeds."""
        from envs.babyai_text.diagnosis import failure_mode

        return failure_mode(self, split, seed, calls)

    def expert(self) -> Expert:
        """The BabyAI bot, planning from the episode just reset."""
        from envs.babyai_text.expert import BabyAIExpert

        return BabyAIExpert(self, self.config.expert_deviation)

    def privileged_map(self) -> str:
        """Every object and door of the episode just reset, relative to the agent's start pose
        (privileged context: the bot sees the whole grid, the agent only its 7x7 view)."""
        level = self.level
        return "\n".join(describe_map(level.grid, tuple(level.agent_pos), tuple(level.dir_vec),
                                       tuple(level.right_vec)))

    def step_action(self, action: int) -> EnvStep:
        """Apply a minigrid action index directly (the expert bot's path)."""
        level = self.level
        obs, reward, terminated, truncated, _ = level.step(action)
        # RoomGridLevel pays a positive reward exactly when its verifier reports success.
        success = bool(terminated and reward > 0)
        self._done = bool(terminated or truncated)
        return EnvStep(observation=self._observation(obs), done=self._done, success=success,
                       num_steps=level.step_count, truncated=bool(truncated and not terminated))

    def _observation(self, obs: dict[str, Any]) -> str:
        level = self.level
        held = (level.carrying.color, level.carrying.type) if level.carrying is not None else None
        lines = describe(obs["image"], held, self.config.observation_order)
        if self.config.observation_memory:
            pose = (tuple(int(v) for v in level.agent_pos), tuple(int(v) for v in level.dir_vec),
                    tuple(int(v) for v in level.right_vec))
            in_view = seen_cells(obs["image"], *pose)
            lines += recalled(self._memory, in_view, *pose)
            for cell, what in in_view.items():
                if what is None:
                    self._memory.pop(cell, None)
                else:
                    self._memory[cell] = what
        return "\n".join(lines)
