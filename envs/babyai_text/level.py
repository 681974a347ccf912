"""The MixedTrainLocal level on minigrid 3.2, with the task type chosen per episode.

Re-implemented from the BabyAI-Text study (docs/babyai_text.md; the original level picks its
task kind once per env instance from an unseeded RNG; here `task_type` is set before every
reset). One 8x8 room with 9 or 10 objects (keys, balls, boxes; colours may repeat), or for
`open` two rooms side by side joined by a locked door whose key and 8 distractors share the
agent's room. Room size and distractor count are parameters: the defaults are the study's
level, smaller values make the starter levels a tiny student can learn in minutes. A
generated task is rejected and regenerated, quietly, while some object is unreachable, the
instruction names a held-out combination, or minigrid's own instruction checks fail.
"""

from __future__ import annotations

from minigrid.core.roomgrid import RoomGrid
from minigrid.envs.babyai.core.roomgrid_level import RejectSampling, RoomGridLevel
from minigrid.envs.babyai.core.verifier import (
    AfterInstr,
    BeforeInstr,
    GoToInstr,
    ObjDesc,
    OpenInstr,
    PickupInstr,
    PutNextInstr,
)

from envs.babyai_text.tasks import TASK_TYPES

HELD_OUT_PHRASES: tuple[str, ...] = ("yellow box", "red key", "red door", "green ball", "grey door")
"""Instructions containing any of these are never generated (held out by the original level)."""
LOCKED_DOOR_COLORS: tuple[str, ...] = ("yellow", "green", "blue", "purple")
ROOM_SIZE = 8
"""The study's room: 8x8 cells including walls (6x6 free)."""
NUM_DISTRACTORS = 8
"""The study's distractors besides the task's own objects."""


def num_rooms(task_type: str) -> int:
    """Rooms side by side for a task type: two for `open`, else one."""
    return 2 if task_type == "open" else 1


class MixedTrainLocalLevel(RoomGridLevel):
    """One grid shape (1 or 2 rooms); `task_type` selects the generator for the next reset."""

    def __init__(self, num_cols: int, max_attempts: int = 1000, room_size: int = ROOM_SIZE,
                 num_distractors: int = NUM_DISTRACTORS) -> None:
        self.task_type = "open" if num_cols == 2 else "go_to"
        self.max_attempts = max_attempts
        self.num_distractors = num_distractors
        self.num_rejections = 0
        super().__init__(room_size=room_size, num_rows=1, num_cols=num_cols)

    def _gen_grid(self, width: int, height: int) -> None:
        assert num_rooms(self.task_type) == self.num_cols, (self.task_type, self.num_cols)
        self.num_rejections = 0
        for _ in range(self.max_attempts):
            RoomGrid._gen_grid(self, width, height)
            try:
                self._gen_task()
                self.validate_instrs(self.instrs)
            except (RejectSampling, RecursionError):
                self.num_rejections += 1
                continue
            if self.check_objs_reachable(raise_exc=False) and not self._names_held_out():
                break
            self.num_rejections += 1
        else:
            raise RuntimeError(f"could not generate a {self.task_type} task in {self.max_attempts} attempts")
        self.surface = self.instrs.surface(self)
        self.mission = self.surface

    def gen_mission(self) -> None:
        # RoomGridLevel's own generator is replaced by _gen_grid above.
        raise NotImplementedError

    def _names_held_out(self) -> bool:
        surface = self.instrs.surface(self)
        return any(phrase in surface for phrase in HELD_OUT_PHRASES)

    def _gen_task(self) -> None:
        kind = self.task_type
        if kind == "open":
            self._gen_open()
            return
        self.place_agent()
        num_objs = self.num_distractors + (1 if kind in ("go_to", "pick_up") else 2)
        objs = self.add_distractors(num_distractors=num_objs, all_unique=False)
        a = self._rand_elem(objs)
        desc_a = ObjDesc(a.type, a.color)
        if kind == "go_to":
            self.instrs = GoToInstr(desc_a)
            return
        if kind == "pick_up":
            self.instrs = PickupInstr(desc_a)
            return
        b = self._rand_elem(objs)
        if (b.type, b.color) == (a.type, a.color) and len(desc_a.find_matching_objs(self)[0]) < 2:
            # A unique A must differ from B: "put the red ball next to the red ball" is impossible.
            while (b.type, b.color) == (a.type, a.color):
                b = self._rand_elem(objs)
        desc_b = ObjDesc(b.type, b.color)
        if kind == "put_next_to":
            self.instrs = PutNextInstr(desc_a, desc_b)
        elif kind == "pick_up_then_go_to":
            self.instrs = BeforeInstr(PickupInstr(desc_a), GoToInstr(desc_b))
        elif kind == "go_to_after_pick_up":
            self.instrs = AfterInstr(GoToInstr(desc_b), PickupInstr(desc_a))
        else:
            raise ValueError(f"unknown task type {kind!r}; known: {list(TASK_TYPES)}")

    def _gen_open(self) -> None:
        locked_i = self._rand_int(0, 2)
        agent_i = 1 - locked_i
        color = self._rand_elem(LOCKED_DOOR_COLORS)
        # Door index toward the other room: 0 = right wall, 2 = left wall.
        self.add_door(locked_i, 0, door_idx=0 if locked_i == 0 else 2, color=color, locked=True)
        self.locked_room = self.get_room(locked_i, 0)
        self.add_object(agent_i, 0, "key", color)
        self.add_distractors(agent_i, 0, num_distractors=self.num_distractors, all_unique=False)
        self.place_agent(agent_i, 0)
        self.instrs = OpenInstr(ObjDesc("door", self._rand_elem([None, color])))
