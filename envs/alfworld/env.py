"""ALFWorld (TextWorld household tasks) as a `TextEnv`: one `act` tool whose argument is a text command.

Data: the layout `alfworld-download` writes to $ALFWORLD_DATA (`json_2.1.1/<split>/<task>/<trial>/`
with `game.tw-pddl` and `traj_data.json`). A split's games are ALFWorld's own filter (no movable
or sliced tasks, only games marked solvable) in a fixed order; seed i plays game i mod n, so
(split, seed) is always the same game. valid_seen and valid_unseen give the standard 140 and 134.

Games built for an older ALFWorld (2.1.1 files carry their own domain and grammar, in which
"put" is a command the 0.4.2 expert does not say) are rebuilt once with the installed package's
PDDL domain and grammar, keeping the problem, the solvable flag and the task sentence, into a
cache (docs/alfworld.md); games already built with the package's domain are used as they are.

Each call is checked against the game's admissible commands before it reaches TextWorld: an
inadmissible one costs a step and is answered with an error observation naming it (and the
admissible commands), never an exception. Success is the game's own `won`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import random
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator

from cluster.files import default_cache_dir
from envs.parser import recover_command
from envs.protocol import EnvReset, EnvStep, Expert, TaskInfo, ToolCall
from envs.registry import EnvConfig

TASK_TYPES = ("pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
              "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place")
SPLITS = ("train", "valid_seen", "valid_unseen", "valid_train")
"""Directories of json_2.1.1 a split can name (valid_train: the extra games used for training here)."""

SYSTEM_PROMPT = ("You are an agent in a household. Each turn you run one text command with the act tool, "
                 "such as 'go to desk 1', 'open drawer 2', 'take mug 1 from desk 1', 'move mug 1 to shelf 1', "
                 "'heat mug 1 with microwave 1', 'use desklamp 1' or 'examine mug 1'. Only commands the game "
                 "accepts in the current state are run. Answer with one tool call and nothing else.")

ACT_TOOL = {"type": "function", "function": {
    "name": "act",
    "description": "Run one text command in the household, exactly as the game accepts it.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string", "description": "The command."}},
                   "required": ["command"]}}}

_TASK_LINE = re.compile(r"Your task is to: (.*?)\.?\"")


class AlfWorldConfig(EnvConfig):
    """Where the games are, which task types, what the agent sees."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal["alfworld"] = "alfworld"
    data_dir: str | None = None
    """Root of the `alfworld-download` layout; None: $ALFWORLD_DATA."""
    task_types: tuple[str, ...] = Field(default=TASK_TYPES, min_length=1)
    show_admissible: bool = True
    """End every observation with the admissible commands (the seeds' prompt does)."""
    max_steps: int = Field(default=50, ge=1)
    """Environment step limit per episode (ALFWorld's evaluations use 50)."""
    cache_dir: str | None = None
    """Where rebuilt games are written; None: $APPRENTICE_CACHE/alfworld."""

    @field_validator("task_types")
    @classmethod
    def _known_types(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [t for t in value if t not in TASK_TYPES]
        if unknown:
            raise ValueError(f"unknown ALFWorld task type(s) {unknown}; known: {list(TASK_TYPES)}")
        return value

    def root(self) -> Path:
        raw = self.data_dir or os.environ.get("ALFWORLD_DATA")
        if not raw:
            raise ValueError("env.data_dir is not set and $ALFWORLD_DATA is empty: point either at the directory "
                             "`alfworld-download` filled (it holds json_2.1.1/)")
        root = Path(raw).expanduser()
        if not (root / "json_2.1.1").is_dir():
            raise ValueError(f"env.data_dir {str(root)!r} has no json_2.1.1/ directory (the alfworld-download layout)")
        return root


@functools.lru_cache(maxsize=None)
def split_games(root: Path, split: str, task_types: tuple[str, ...]) -> tuple[tuple[Path, str], ...]:
    """(game directory, task type) of a split after ALFWorld's filter, in a fixed shuffled order
    (sorted by path, then shuffled with the split's name as seed) so the first n mix task types."""
    games = []
    base = root / "json_2.1.1" / split
    for traj in sorted(base.glob("*/*/traj_data.json")):
        trial = traj.parent
        where = str(trial.relative_to(base))
        if "movable" in where or "Sliced" in where:
            continue
        game = trial / "game.tw-pddl"
        if not game.is_file():
            continue
        task_type = json.loads(traj.read_text())["task_type"]
        if task_type in task_types and json.loads(game.read_text()).get("solvable", False):
            games.append((trial, task_type))
    random.Random(f"alfworld:{split}").shuffle(games)
    return tuple(games)


@functools.lru_cache(maxsize=1)
def _package_logic() -> tuple[str, str]:
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    return Path(ALFRED_PDDL_PATH).read_text(), Path(ALFRED_TWL2_PATH).read_text()


@functools.lru_cache(maxsize=None)
def playable_game(trial: Path, cache: Path) -> Path:
    """The game file to load: the original when it was built with the package's domain,
    otherwise a copy rebuilt with the package's domain and grammar (written once, atomically).
    Remembered per process: a reset reads no game file twice."""
    original = trial / "game.tw-pddl"
    domain, grammar = _package_logic()
    data = json.loads(original.read_text())
    if data["pddl_domain"] == domain:
        return original
    key = hashlib.sha256(str(trial.resolve()).encode()).hexdigest()[:16]
    target = cache / key / "game.tw-pddl"
    if target.is_file():
        return target
    found = _TASK_LINE.search(data["grammar"])
    if found is None:
        raise ValueError(f"{original}: no 'Your task is to: ...' sentence in its grammar to carry over")
    target.parent.mkdir(parents=True, exist_ok=True)
    # The package's expert reads traj_data.json next to the game file.
    (target.parent / "traj_data.json").write_text((trial / "traj_data.json").read_text())
    rebuilt = {**data, "pddl_domain": domain, "grammar": grammar.replace("UNKNOWN GOAL", found.group(1))}
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(rebuilt))
    os.replace(tmp, target)
    return target


@contextlib.contextmanager
def _expert_random(rng: random.Random):
    """The package's hand-coded expert draws from the module-global `random` (its exploration
    order); each environment lends it its own generator, seeded by the task, so an episode (and an
    expert's advice in a replay) is the same whichever environments share the process."""
    from alfworld.agents.expert import handcoded_expert

    saved, handcoded_expert.random = handcoded_expert.random, rng
    try:
        yield
    finally:
        handcoded_expert.random = saved


TRANSLATIONS_KEPT = 4
"""fast_downward translations a process keeps: a game's two (plain and optimised), for the
current game and the one before."""


def _translate_each_game_once() -> None:
    """Keep fast_downward's last PDDL -> SAS translations in this process. textworld builds a
    new game's state in `load` and again in the `reset` that follows, each time translating the
    problem twice: four translations, of which two repeat, for half of a reset's time
    (docs/alfworld.md). A translation is a function of its arguments only (it sets the
    translator's options from them and returns a new task and SAS text), and textworld only
    reads the task it returns."""
    import fast_downward

    if not hasattr(fast_downward.pddl2sas, "cache_info"):
        fast_downward.pddl2sas = functools.lru_cache(maxsize=TRANSLATIONS_KEPT)(fast_downward.pddl2sas)


class AlfWorldEnv:
    """One ALFWorld game at a time (TextWorld, with the package's hand-coded expert attached)."""

    system_prompt = SYSTEM_PROMPT

    def __init__(self, config: AlfWorldConfig | None = None) -> None:
        self.config = config or AlfWorldConfig()
        self.root = self.config.root()
        self.splits = tuple(s for s in SPLITS if (self.root / "json_2.1.1" / s).is_dir())
        self.cache = (Path(self.config.cache_dir).expanduser() if self.config.cache_dir
                      else default_cache_dir() / "alfworld")
        self._env = None
        self._rng = random.Random()
        self._state: Any = None
        self._steps = 0
        self._done = True

    @property
    def task_types(self) -> tuple[str, ...]:
        return self.config.task_types

    @property
    def tools(self) -> list[dict[str, Any]]:
        return [ACT_TOOL]

    def _games(self, split: str) -> tuple[tuple[Path, str], ...]:
        if split not in self.splits:
            raise ValueError(f"ALFWorld has no split {split!r} under {self.root}; its splits: {list(self.splits)}")
        games = split_games(self.root, split, self.config.task_types)
        if not games:
            raise ValueError(f"ALFWorld split {split!r} has no game of task types {list(self.config.task_types)}")
        return games

    def split_size(self, split: str) -> int | None:
        return len(self._games(split))

    def reset(self, seed: int, split: str = "valid_train") -> EnvReset:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert, AlfredInfos

        _translate_each_game_once()
        games = self._games(split)
        trial, task_type = games[seed % len(games)]
        if self._env is not None:
            self._env.close()
        infos = textworld.EnvInfos(won=True, admissible_commands=True, feedback=True, extras=["gamefile", "expert_plan"])
        self._env = textworld.start(str(playable_game(trial, self.cache)), request_infos=infos,
                                    wrappers=[AlfredDemangler, AlfredInfos, AlfredExpert])
        self._rng = random.Random(f"{split}:{seed}")
        with _expert_random(self._rng):
            self._state = self._env.reset()
        self._steps, self._done = 0, False
        info = TaskInfo(split=split, seed=seed, task_type=task_type, max_steps=self.config.max_steps)
        intro, _, task = self._state.feedback.partition("Your task is to: ")
        intro = intro.replace("-= Welcome to TextWorld, ALFRED! =-", "").strip()
        return EnvReset(task=task.strip().rstrip("."), observation=self._observation(intro), info=info)

    @property
    def admissible(self) -> list[str]:
        return list(self._state["admissible_commands"])

    def step(self, call: ToolCall) -> EnvStep:
        if self._done:
            raise RuntimeError("the episode is over: call reset() before step()")
        if call.name != "act":
            raise ValueError(f"unknown tool {call.name!r}; known: ['act']")
        command = " ".join(str(call.arguments.get("command", "")).split())
        self._steps += 1
        if command in self._state["admissible_commands"]:
            with _expert_random(self._rng):  # the expert's next plan is computed inside the step
                self._state, _, _ = self._env.step(command)
            feedback = self._state.feedback.strip()
        else:
            feedback = f"Not admissible here: {command!r}. Run one of the admissible commands."
        won = bool(self._state["won"])
        truncated = not won and self._steps >= self.config.max_steps
        self._done = won or truncated
        return EnvStep(observation=self._observation(feedback), done=self._done, success=won,
                       num_steps=self._steps, truncated=truncated)

    def recover(self, text: str) -> ToolCall | None:
        """The admissible command the response names last (in its last `envs.parser.RECOVERY_TAIL_WORDS` words),
        as `act`: a malformed call still acts, as the gentle recipe does for BabyAI's tool names."""
        command = recover_command(text, self.admissible)
        return None if command is None else ToolCall("act", {"command": command})

    def expert(self) -> Expert:
        """ALFWorld's hand-coded expert, following the episode just reset."""
        return AlfWorldExpert(self)

    def expert_command(self) -> str | None:
        plan = self._state["extra.expert_plan"] if self._state is not None else None
        return plan[0] if plan else None

    def _observation(self, text: str) -> str:
        if not self.config.show_admissible:
            return text
        return f"{text}\nAdmissible commands: {', '.join(self.admissible)}"


class AlfWorldExpert:
    """The package's hand-coded expert: it watches the game itself (its plan is recomputed after
    every command the game runs), so the executed call needs no replay here."""

    def __init__(self, env: AlfWorldEnv) -> None:
        self.env = env

    def act(self, executed: ToolCall | None) -> ToolCall | None:
        command = self.env.expert_command()
        return None if command is None else ToolCall("act", {"command": command})
