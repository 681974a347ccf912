"""Golden sentences of the BabyAI-Text observation, on hand-built views and states."""

import re

import numpy as np
import pytest
from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX
from minigrid.core.grid import Grid
from minigrid.core.mission import MissionSpace
from minigrid.core.world_object import Ball, Box, Door, Key
from minigrid.minigrid_env import MiniGridEnv

from envs.babyai_text import BabyAITextEnv
from envs.babyai_text.env import BabyAITextConfig
from envs.babyai_text.text_obs import describe, recalled, seen_cells
from envs.protocol import ToolCall

STATE = {"open": 0, "closed": 1, "locked": 2}


def view(cells: dict[tuple[int, int], tuple], fill: str = "empty") -> np.ndarray:
    """A 7x7 egocentric view; cells maps (x, y) -> (type, colour[, state]); the agent is at (3, 6)."""
    image = np.zeros((7, 7, 3), dtype=np.uint8)
    image[:, :, 0] = OBJECT_TO_IDX[fill]
    for (x, y), spec in cells.items():
        kind, color, *state = spec
        image[x, y] = (OBJECT_TO_IDX[kind], COLOR_TO_IDX[color], STATE[state[0]] if state else 0)
    return image


def test_walls_forward_left_right_singular_and_plural():
    cells = {(3, 3): ("wall", "grey"), (2, 6): ("wall", "grey"), (6, 6): ("wall", "grey")}
    assert describe(view(cells)) == [
        "You see a wall 3 steps forward",
        "You see a wall 1 step left",
        "You see a wall 3 steps right",
    ]


def test_wall_scan_stops_at_the_first_non_empty_cell():
    cells = {(3, 4): ("ball", "red"), (3, 2): ("wall", "grey"), (1, 6): ("key", "blue"), (0, 6): ("wall", "grey")}
    assert describe(view(cells)) == [
        "You see a blue key 2 steps left",
        "You see a red ball 2 steps forward",
    ]


def test_wall_scan_skips_unseen_cells():
    image = view({(3, 1): ("wall", "grey")})
    image[3, 4] = 0  # unseen
    assert describe(image) == ["You see a wall 5 steps forward"]


def test_unseen_cells_hide_objects():
    image = view({(0, 0): ("ball", "red")}, fill="unseen")
    image[0, 0] = 0
    assert describe(image) == []


@pytest.mark.parametrize("state", ["open", "closed", "locked"])
def test_doors_report_their_state_with_article_a(state):
    assert describe(view({(5, 6): ("door", "yellow", state)})) == [f"You see a {state} yellow door 2 steps right"]


@pytest.mark.parametrize("pos, where", [
    ((3, 5), "1 step forward"),
    ((3, 0), "6 steps forward"),
    ((2, 6), "1 step left"),
    ((0, 6), "3 steps left"),
    ((4, 6), "1 step right"),
    ((6, 6), "3 steps right"),
    ((2, 5), "1 step left and 1 step forward"),
    ((0, 2), "3 steps left and 4 steps forward"),
    ((4, 5), "1 step right and 1 step forward"),
    ((6, 0), "3 steps right and 6 steps forward"),
])
def test_each_relative_position(pos, where):
    assert describe(view({pos: ("box", "purple")})) == [f"You see a purple box {where}"]


def test_column_major_order_far_to_near_and_carrying():
    cells = {(4, 5): ("key", "green"), (1, 4): ("ball", "red"), (1, 1): ("box", "grey"), (4, 0): ("ball", "blue")}
    image = view(cells)
    image[3, 6] = (OBJECT_TO_IDX["key"], COLOR_TO_IDX["yellow"], 0)  # minigrid draws the carried object here
    assert describe(image, carrying=("yellow", "key")) == [
        "You carry a yellow key",
        "You see a grey box 2 steps left and 5 steps forward",
        "You see a red ball 2 steps left and 2 steps forward",
        "You see a blue ball 1 step right and 6 steps forward",
        "You see a green key 1 step right and 1 step forward",
    ]


def test_nearest_order_puts_the_cell_in_front_first_and_keeps_every_sentence():
    cells = {(1, 6): ("key", "blue"), (4, 5): ("key", "green"), (3, 5): ("box", "red"), (1, 1): ("box", "grey"),
             (6, 6): ("wall", "grey"), (2, 6): ("ball", "purple")}
    image = view(cells)
    image[3, 6] = (OBJECT_TO_IDX["key"], COLOR_TO_IDX["yellow"], 0)
    nearest = describe(image, carrying=("yellow", "key"), order="nearest")
    assert nearest == [
        "You carry a yellow key",
        "You see a red box 1 step forward",
        "You see a purple ball 1 step left",
        "You see a blue key 2 steps left",
        "You see a green key 1 step right and 1 step forward",
        "You see a wall 3 steps right",
        "You see a grey box 2 steps left and 5 steps forward",
    ]
    # Steps from the agent, then forward, left, right: only the order differs from the scan's.
    assert sorted(nearest) == sorted(describe(image, carrying=("yellow", "key")))


class HandBuilt(MiniGridEnv):
    """A 7x7 room; the agent at (3, 5) faces up (direction 3)."""

    def __init__(self, place):
        self._place = place
        super().__init__(mission_space=MissionSpace(mission_func=lambda: "test"), grid_size=7, max_steps=10)

    def _gen_grid(self, width, height):
        self.grid = Grid(width, height)
        self.grid.wall_rect(0, 0, width, height)
        self._place(self.grid)
        self.agent_pos, self.agent_dir, self.mission = (3, 5), 3, "test"


def test_hand_built_state_through_minigrid_visibility():
    def place(grid):
        grid.horz_wall(1, 3, 5)          # a wall row two steps ahead...
        grid.set(3, 2, Ball("red"))      # ...hides this ball
        grid.set(1, 5, Key("blue"))      # on the agent's row: ends the left wall scan
        grid.set(6, 4, Door("green", is_open=False, is_locked=True))

    env = HandBuilt(place)
    env.reset(seed=0)
    env.carrying = Box("grey")
    assert describe(env.gen_obs()["image"], carrying=("grey", "box")) == [
        "You carry a grey box",
        "You see a wall 2 steps forward",
        "You see a wall 3 steps right",
        "You see a blue key 2 steps left",
        "You see a locked green door 3 steps right and 1 step forward",
    ]


SEEDED_GOLDENS = [
    ("train", 0, "open", "open the green door",
     "You see a wall 1 step left\nYou see a purple key 2 steps forward\n"
     "You see a purple ball 1 step right and 1 step forward"),
    ("train", 7, "put_next_to", "put a blue key next to the grey ball",
     "You see a wall 2 steps right\nYou see a green ball 2 steps left and 1 step forward\n"
     "You see a red box 2 steps left\nYou see a purple box 1 step left and 5 steps forward\n"
     "You see a yellow ball 1 step left and 2 steps forward\nYou see a blue key 5 steps forward\n"
     "You see a purple ball 1 step right and 4 steps forward\nYou see a blue ball 1 step right and 2 steps forward\n"
     "You see a yellow ball 1 step right and 1 step forward"),
    ("eval", 0, "go_to_after_pick_up", "go to the grey key after you pick up a red box",
     "You see a wall 3 steps forward\nYou see a wall 3 steps right\n"
     "You see a yellow key 2 steps left and 2 steps forward\nYou see a red box 2 steps left"),
    ("eval50", 0, "go_to", "go to a yellow key",
     "You see a wall 3 steps forward\nYou see a yellow box 2 steps left and 2 steps forward\n"
     "You see a red ball 2 steps left and 1 step forward\nYou see a yellow key 2 steps left\n"
     "You see a yellow key 1 step right and 2 steps forward"),
]


@pytest.mark.parametrize("split, seed, task_type, task, observation", SEEDED_GOLDENS)
def test_seeded_resets_are_pinned(split, seed, task_type, task, observation):
    reset = BabyAITextEnv().reset(seed, split)
    assert (reset.info.task_type, reset.task, reset.observation) == (task_type, task, observation)


@pytest.mark.parametrize("direction", range(4))
def test_seen_cells_place_the_view_on_the_grid(direction):
    def place(grid):
        grid.set(1, 4, Ball("red"))
        grid.set(5, 2, Key("blue"))
        grid.set(4, 5, Box("grey"))
        grid.set(6, 3, Door("green", is_open=True))

    env = HandBuilt(place)
    env.reset(seed=0)
    env.agent_dir = direction
    image = env.gen_obs()["image"]
    cells = seen_cells(image, tuple(env.agent_pos), tuple(env.dir_vec), tuple(env.right_vec))
    assert tuple(env.agent_pos) not in cells
    for (x, y), words in cells.items():
        if not (0 <= x < env.grid.width and 0 <= y < env.grid.height):
            assert words is None  # minigrid's view pads beyond the grid with walls
            continue
        obj = env.grid.get(x, y)
        expected = (None if obj is None or obj.type == "wall" else
                    f"open {obj.color} door" if obj.type == "door" else f"{obj.color} {obj.type}")
        assert words == expected, (x, y)
    # As many objects as the view's sentences name.
    assert sum(words is not None for words in cells.values()) == sum(
        line.startswith("You see a") and "wall" not in line for line in describe(image))


def test_recalled_skips_what_is_in_view_and_goes_nearest_first():
    memory = {(1, 1): "red ball", (5, 5): "blue key", (3, 2): "grey box"}
    # At (3, 3) facing right (+x): forward is +x, right is +y.
    lines = recalled(memory, {(5, 5)}, (3, 3), (1, 0), (0, 1))
    assert lines == ["You remember a grey box 1 step left", "You remember a red ball 2 steps left and 2 steps back"]


def test_memory_after_turning_around_recalls_the_first_view_behind():
    env = BabyAITextEnv(BabyAITextConfig(observation_memory=True))
    first = env.reset(7, "train").observation.split("\n")
    env.step(ToolCall("turn_left"))
    behind = env.step(ToolCall("turn_left")).observation.split("\n")
    expected = []
    for line in first:
        match = re.fullmatch(r"You see an? (.+?) (?:(\d+ steps?) (left|right))?(?: and )?(?:(\d+ steps?) forward)?", line)
        what, side_steps, side, forward_steps = match.groups()
        if "wall" in what or forward_steps is None:  # walls are not remembered; on the agent's row still in view
            continue
        other = {"left": "right", "right": "left"}.get(side)
        where = " and ".join(part for part in (side_steps and f"{side_steps} {other}", f"{forward_steps} back") if part)
        expected.append(f"You remember a {what} {where}")
    remembered = [line for line in behind if line.startswith("You remember")]
    # The view between the two turns may add objects of its own.
    assert expected and set(expected) <= set(remembered)
    assert not any(line.startswith("You remember") for line in BabyAITextEnv().reset(7, "train").observation.split("\n"))


def test_memory_forgets_an_object_once_picked_up():
    env = BabyAITextEnv(BabyAITextConfig(observation_memory=True, expert_deviation="replan"))
    env.reset(7, "train")  # put a blue key next to the grey ball
    bot, call = env.expert(), None
    while (call := bot.act(call)).name != "pick_up":
        env.step(call)
    front = tuple(int(v) for v in env.level.front_pos)
    assert front in env._memory
    env.step(call)
    assert env.level.carrying is not None and front not in env._memory
