"""Where a failed BabyAI-Text episode went wrong, read by replaying its executed calls.

An episode is deterministic for its (split, seed) and its executed calls (envs.protocol), so the
replay sees the grid the agent saw. Every task is a sequence of subgoals on the objects its
instruction names: `go_to` A; `pick_up` A; `put_next_to` = pick up A, then drop it next to B;
`pick_up_then_go_to` and `go_to_after_pick_up` = pick up A, then go to B; `open` = pick up the
door's key, then open the door. A failed episode gets the first mode that fits
(docs/babyai_text.md, "Where episodes fail"):

- `format`: at least half of its turns executed nothing (their response did not parse);
- `sequencing`: the first subgoal was reached, the second never;
- `object_choice`: on the first subgoal it handled the wrong object: picked up an object the
  instruction does not name, or (go to) stood at least two steps facing an object of the
  target's type or colour that is not the target;
- `interaction`: it faced the first subgoal's object but never did the action (pick up);
- `navigation`: it never faced the first subgoal's object.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from minigrid.core.world_object import WorldObj
from minigrid.envs.babyai.core.verifier import (
    AfterInstr,
    BeforeInstr,
    GoToInstr,
    Instr,
    OpenInstr,
    PickupInstr,
    PutNextInstr,
)

from envs.protocol import ToolCall

FAILURE_MODES: tuple[str, ...] = ("format", "navigation", "object_choice", "interaction", "sequencing")
"""In the order they are tested."""
OBJECT_TYPES = ("key", "ball", "box")


@dataclass(frozen=True)
class Subgoal:
    kind: str
    """'go_to', 'pick_up', 'put_next_to' or 'open'."""
    targets: tuple[WorldObj, ...]
    """The objects that satisfy it (any one of them; compared by identity)."""


def subgoals(instr: Instr, level) -> list[Subgoal]:
    """The task's subgoals in the order they must be done; the verifier must have been reset
    (minigrid does so in reset), which resolves every description to its objects."""
    if isinstance(instr, GoToInstr):
        return [Subgoal("go_to", tuple(instr.desc.obj_set))]
    if isinstance(instr, PickupInstr):
        return [Subgoal("pick_up", tuple(instr.desc.obj_set))]
    if isinstance(instr, PutNextInstr):
        return [Subgoal("pick_up", tuple(instr.desc_move.obj_set)),
                Subgoal("put_next_to", tuple(instr.desc_fixed.obj_set))]
    if isinstance(instr, BeforeInstr):
        return subgoals(instr.instr_a, level) + subgoals(instr.instr_b, level)
    if isinstance(instr, AfterInstr):  # "do a after b"
        return subgoals(instr.instr_b, level) + subgoals(instr.instr_a, level)
    if isinstance(instr, OpenInstr):
        doors = tuple(instr.desc.obj_set)
        colors = {door.color for door in doors}
        keys = tuple(obj for obj in level.grid.grid if obj is not None and obj.type == "key" and obj.color in colors)
        return [Subgoal("pick_up", keys), Subgoal("open", doors)]
    raise ValueError(f"no subgoals known for instruction {type(instr).__name__}")


def _is(obj: WorldObj | None, targets: tuple[WorldObj, ...]) -> bool:
    return obj is not None and any(obj is t for t in targets)


def _confusable(obj: WorldObj | None, targets: tuple[WorldObj, ...]) -> bool:
    """An object sharing a target's type or colour, that is none of them."""
    return (obj is not None and obj.type in OBJECT_TYPES and not _is(obj, targets)
            and any(obj.type == t.type or obj.color == t.color for t in targets))


def failure_mode(env, split: str, seed: int, calls: Sequence[ToolCall | None]) -> str | None:
    """The failure mode (FAILURE_MODES) of the episode (split, seed) whose turns executed `calls`
    (None: a turn that did not parse, nothing executed); None when the replay succeeds.
    `env`: a BabyAITextEnv with the episode's configuration (it is reset here)."""
    if sum(call is None for call in calls) * 2 >= max(len(calls), 1):
        return "format"
    env.reset(seed, split)
    level = env.level
    goals = subgoals(level.instrs, level)
    reached = 0
    faced = wrong = False  # of the first subgoal
    dwell = 0  # consecutive steps facing the same confusable object (go to)
    last_front = None
    for call in calls:
        if call is None:
            continue
        held_before = level.carrying
        step = env.step(call)
        if step.success:
            return None
        front = level.grid.get(*level.front_pos)
        goal = goals[reached]
        if goal.kind == "pick_up" and _is(level.carrying, goal.targets):
            reached += 1
        elif reached == 0:
            faced |= _is(front, goal.targets)
            if goal.kind == "pick_up":
                wrong |= held_before is None and level.carrying is not None
            else:
                dwell = dwell + 1 if _confusable(front, goal.targets) and front is last_front else 0
                wrong |= dwell >= 1
        last_front = front
        if step.done:
            break
    if reached:
        return "sequencing"
    if wrong:
        return "object_choice"
    return "interaction" if faced else "navigation"
