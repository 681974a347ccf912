"""ScienceWorld (scienceworld 1.2.3: a Scala simulator in a JVM, driven over py4j) as a `TextEnv`:
one `act` tool whose argument is a text command, 30 task types of elementary-school science.

Tasks: a task is one (task type, variation). The simulator divides every task type's variations
into its own train / dev / test ranges (contiguous, in that order; `VARIATIONS` holds their
sizes, a test checks them against the simulator). A split lists its tasks round-robin over the
configured task types (the 1st variation of every type, then the 2nd, ...), so any first n
tasks cover the types evenly; seed i plays task i mod n.

What the agent sees: the simulator's own text (its `look` at reset, then each command's answer),
followed by what it may do, compactly: the action templates and the objects in view
(`show_actions: templates`, ~150 tokens), the simulator's list of valid commands cut to
`max_valid_actions`, shortest first (`valid`), or nothing (`none`).

Outcome: success is the task completed (score 100). The score (0-100; the simulator reports a
failed task, e.g. focusing on the wrong object, as negative and ends the episode) becomes
`EnvStep.score` = max(score, 0) / 100, which the outcome reward interpolates (envs.rewards).
A command the simulator does not know costs a step and is answered with its message and a
hint, never an exception; `reset task` is refused (an episode is one attempt).

The expert replays the simulator's gold action sequence for the variation (docs/scienceworld.md:
what replays). Each instance starts its own JVM at its first reset (~1 s; py4j binds it to
127.0.0.1 and the JVM exits when its Python process does, even on SIGKILL: it watches its stdin).
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator

from envs.parser import recover_command
from envs.protocol import EnvReset, EnvStep, Expert, TaskInfo, ToolCall
from envs.registry import EnvConfig

VARIATIONS: dict[str, tuple[int, int, int]] = {
    "boil": (14, 7, 9),
    "change-the-state-of-matter-of": (14, 7, 9),
    "chemistry-mix": (16, 8, 8),
    "chemistry-mix-paint-secondary-color": (18, 9, 9),
    "chemistry-mix-paint-tertiary-color": (18, 9, 9),
    "find-animal": (150, 75, 75),
    "find-living-thing": (150, 75, 75),
    "find-non-living-thing": (150, 75, 75),
    "find-plant": (150, 75, 75),
    "freeze": (14, 7, 9),
    "grow-fruit": (62, 31, 33),
    "grow-plant": (62, 31, 33),
    "identify-life-stages-1": (6, 3, 5),
    "identify-life-stages-2": (4, 2, 4),
    "inclined-plane-determine-angle": (84, 42, 42),
    "inclined-plane-friction-named-surfaces": (692, 346, 348),
    "inclined-plane-friction-unnamed-surfaces": (80, 40, 42),
    "lifespan-longest-lived": (62, 31, 32),
    "lifespan-longest-lived-then-shortest-lived": (62, 31, 32),
    "lifespan-shortest-lived": (62, 31, 32),
    "measure-melting-point-known-substance": (218, 109, 109),
    "measure-melting-point-unknown-substance": (150, 75, 75),
    "melt": (14, 7, 9),
    "mendelian-genetics-known-plant": (60, 30, 30),
    "mendelian-genetics-unknown-plant": (240, 120, 120),
    "power-component": (10, 5, 5),
    "power-component-renewable-vs-nonrenewable-energy": (10, 5, 5),
    "test-conductivity": (450, 225, 225),
    "test-conductivity-of-unknown-substances": (300, 150, 150),
    "use-thermometer": (270, 135, 135),
}
"""Task type -> number of (train, dev, test) variations, the simulator's own split of 1.2.3
(3,592 / 1,796 / 1,819 in all)."""
TASK_TYPES = tuple(VARIATIONS)
SPLITS = ("train", "dev", "test")

SYSTEM_PROMPT = ("You are an agent in a small world of rooms doing a science task. Each turn you run one text "
                 "command with the act tool, such as 'look around', 'go to kitchen', 'open door to kitchen', "
                 "'pick up thermometer', 'focus on water', 'move metal pot to stove', 'activate stove', "
                 "'use thermometer in inventory on water' or 'wait'. 'focus on' an object tells the world it is "
                 "the one the task is about: focus only on what the task names. Answer with one tool call and "
                 "nothing else.")

ACT_TOOL = {"type": "function", "function": {
    "name": "act",
    "description": "Run one text command in the world, as the simulator accepts it.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string", "description": "The command."}},
                   "required": ["command"]}}}

UNKNOWN_COMMAND = "No known action matches that input."
"""The simulator's answer to a command it cannot parse."""
HIDDEN_TEMPLATES = ("reset task", "wait1")
"""Templates not offered: `reset task` would restart the episode, `wait1` duplicates `wait`."""


class ScienceWorldConfig(EnvConfig):
    """Which task types, which simplifications, what the agent sees."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal["scienceworld"] = "scienceworld"
    task_types: tuple[str, ...] = Field(default=TASK_TYPES, min_length=1)
    simplifications: str = "easy"
    """The simulator's simplification string: 'easy' (teleporting, open doors, self-watering
    pots, no electrical actions outside electrical tasks), '' for none, or a comma-separated
    list of its names."""
    max_steps: int = Field(default=30, ge=1)
    """Environment step limit per episode (document 003 states no number for ScienceWorld; 30
    lets the expert finish most types: docs/scienceworld.md)."""
    jvm_heap_mb: int = Field(default=384, ge=128)
    """The JVM's heap limit. Java's default (a quarter of the machine's memory) lets one idle
    simulator grow past 3 GB; with 256 MB and the serial collector the longest gold path
    (mendelian genetics, 132 commands) runs in ~0.3 GB resident."""
    show_actions: Literal["templates", "valid", "none"] = "templates"
    max_valid_actions: int = Field(default=60, ge=1)
    """With show_actions=valid: how many of the simulator's valid commands to list."""

    @field_validator("task_types")
    @classmethod
    def _known_types(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [t for t in value if t not in VARIATIONS]
        if unknown:
            raise ValueError(f"unknown ScienceWorld task type(s) {unknown}; known: {list(TASK_TYPES)}")
        return value


def variations(task_type: str, split: str) -> range:
    """The simulator's variation indices of one task type in one split."""
    num_train, num_dev, num_test = VARIATIONS[task_type]
    start = {"train": 0, "dev": num_train, "test": num_train + num_dev}[split]
    return range(start, start + {"train": num_train, "dev": num_dev, "test": num_test}[split])


@functools.lru_cache(maxsize=None)
def split_tasks(split: str, task_types: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """(task type, variation) of a split, round-robin over the task types."""
    per_type = [variations(t, split) for t in task_types]
    return tuple((task_type, found[i]) for i in range(max(map(len, per_type)))
                 for task_type, found in zip(task_types, per_type) if i < len(found))


@contextlib.contextmanager
def _environ(**values: str):
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key)
            else:
                os.environ[key] = value


class ScienceWorldEnv:
    """One ScienceWorld task at a time, in this process's own JVM (started at the first reset)."""

    system_prompt = SYSTEM_PROMPT
    splits = SPLITS

    def __init__(self, config: ScienceWorldConfig | None = None) -> None:
        self.config = config or ScienceWorldConfig()
        self._sim: Any = None
        self._task: tuple[str, int] | None = None
        self._gold: tuple[str, ...] | None = None
        self._gold_paths: dict[tuple[str, int], tuple[str, ...]] = {}
        """Gold paths generated so far, per (task type, variation): a group's episodes, and the
        oracle's replays of them, ask for the same task's again."""
        self._steps = 0
        self._score = 0.0
        """The simulator's latest score (0-100): a refused command leaves it as it was."""
        self._done = True

    @property
    def task_types(self) -> tuple[str, ...]:
        return self.config.task_types

    @property
    def tools(self) -> list[dict[str, Any]]:
        return [ACT_TOOL]

    def _tasks(self, split: str) -> tuple[tuple[str, int], ...]:
        if split not in SPLITS:
            raise ValueError(f"ScienceWorld has no split {split!r}; its splits: {list(SPLITS)}")
        return split_tasks(split, self.config.task_types)

    def split_size(self, split: str) -> int | None:
        return len(self._tasks(split))

    @property
    def simulator(self) -> Any:
        """The py4j-backed simulator (scienceworld.ScienceWorldEnv), its JVM started on first use."""
        if self._sim is None:
            from scienceworld import ScienceWorldEnv as Simulator

            # The package starts its JVM without options of ours; Java reads JAVA_TOOL_OPTIONS
            # from the environment it inherits, set for the launch only. The simulator's own
            # step limit stays out of the way: max_steps is counted here, unknown commands too.
            with _environ(JAVA_TOOL_OPTIONS=f"-Xmx{self.config.jvm_heap_mb}m -XX:+UseSerialGC"):
                self._sim = Simulator("", envStepLimit=10 * self.config.max_steps + 100)
        return self._sim

    def reset(self, seed: int, split: str = "train") -> EnvReset:
        tasks = self._tasks(split)
        task_type, variation = tasks[seed % len(tasks)]
        sim = self.simulator
        sim.load(task_type, variation, self.config.simplifications)
        observation, _ = sim.reset()
        self._task = (task_type, variation)
        self._gold = self._gold_paths.get(self._task)
        self._steps, self._score, self._done = 0, 0.0, False
        info = TaskInfo(split=split, seed=seed, task_type=task_type, max_steps=self.config.max_steps)
        return EnvReset(task=sim.get_task_description().strip(), observation=self._observation(observation.strip()),
                        info=info)

    def step(self, call: ToolCall) -> EnvStep:
        if self._done:
            raise RuntimeError("the episode is over: call reset() before step()")
        if call.name != "act":
            raise ValueError(f"unknown tool {call.name!r}; known: ['act']")
        command = " ".join(str(call.arguments.get("command", "")).split())
        self._steps += 1
        finished = False
        if not command:
            feedback = "The command is empty. Run one of the actions below."
        elif command.lower() == "reset task":
            feedback = "'reset task' is not available: an episode is one attempt."
        else:
            text, _, finished, info = self.simulator.step(command)
            self._score = float(info["score"])
            feedback = text.strip()
            if feedback == UNKNOWN_COMMAND:
                feedback = f"No known action matches {command!r}. Use one of the actions below."
        success = self._score >= 100
        truncated = not finished and self._steps >= self.config.max_steps
        self._done = finished or truncated
        return EnvStep(observation=self._observation(feedback), done=self._done, success=success,
                       num_steps=self._steps, truncated=truncated, score=min(max(self._score, 0.0), 100.0) / 100)

    def recover(self, text: str) -> ToolCall | None:
        """The valid command the response names last (envs.parser.recover_command), as `act`."""
        command = recover_command(text, list(self.simulator.get_valid_action_object_combinations()))
        return None if command is None else ToolCall("act", {"command": command})

    def expert(self) -> Expert:
        """The simulator's gold action sequence for the task just reset. Generating it makes a
        load cost up to 9 s (mendelian genetics) instead of 0.03 s, so it is asked for only here
        (and kept per task): the task is loaded again with it, before any step (the world
        starts the same)."""
        if self._gold is None:
            if self._steps:
                raise RuntimeError("ask for the expert right after reset(): its gold path is generated by a reload")
            sim = self.simulator
            sim.load(*self._task, self.config.simplifications, generateGoldPath=True)
            sim.reset()
            self._gold = tuple(sim.get_gold_action_sequence()) if sim.goldPathGenerated else ()
            self._gold_paths[self._task] = self._gold
        return GoldPathExpert(self._gold)

    def close(self) -> None:
        """Stop this instance's JVM (it also stops when the process exits)."""
        if self._sim is not None:
            self._sim.close()
            self._sim = None

    def _observation(self, text: str) -> str:
        mode = self.config.show_actions
        if mode == "none":
            return text
        sim = self.simulator
        if mode == "templates":
            templates = [t for t in sim.get_possible_actions() if t not in HIDDEN_TEMPLATES]
            return (f"{text}\nActions (OBJ: an object): {', '.join(templates)}\n"
                    f"Objects: {', '.join(sim.get_possible_objects())}")
        valid = sorted(sim.get_valid_action_object_combinations(), key=lambda c: (len(c), c))  # simplest first
        shown = valid[:self.config.max_valid_actions]
        more = f" (and {len(valid) - len(shown)} more)" if len(valid) > len(shown) else ""
        return f"{text}\nValid commands: {', '.join(shown)}{more}"


class GoldPathExpert:
    """Follows the gold sequence: it moves on when the executed call was its own advice and
    otherwise advises the same command again (a harmless detour, such as 'look around' or an
    unknown command, leaves the rest of the path valid; one that changes the world may not, and
    then the advice is only the path's next step). None once the path is used up."""

    def __init__(self, gold: tuple[str, ...]) -> None:
        self.gold = gold
        self.position = 0
        self._advised: ToolCall | None = None

    def act(self, executed: ToolCall | None) -> ToolCall | None:
        if executed is not None and executed == self._advised:
            self.position += 1
        self._advised = (ToolCall("act", {"command": self.gold[self.position]})
                         if self.position < len(self.gold) else None)
        return self._advised
