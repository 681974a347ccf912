"""BabyAI-Text observation sentences from minigrid's egocentric 7x7 view (docs/babyai_text.md).

The view `image[x, y]` holds (object, colour, state) indices; x runs left to right, y far
to near, the agent sits at the bottom centre looking "forward", and cells it cannot see
are `unseen`. Sentences, one per line:
1. what the agent carries;
2. walls: scan forward, then left, then right along the agent's row, skipping unseen and
   empty cells; the first other cell ends the scan and is reported only if it is a wall;
3. every other visible object, column by column (x left to right, far to near).
That is BabyAI-Text's order ("scan"). With order "nearest" the sentences of 2 and 3 are sorted by
steps from the agent (forward first, then left, then right, at equal steps): the cell in front, the
one a pick-up, drop or toggle acts on, is always the first sentence after what is carried. Same
sentences, same content; a small student compares the object in front with the instruction's
words at a fixed place instead of finding it among the lines (docs/babyai_text.md, "Nearest first").

`seen_cells` and `recalled` are the agent's memory of objects out of view (`env.observation_memory`):
what earlier views showed, placed relative to the agent's pose now. Nothing in it comes from outside
the agent's own views: a turn always turns, and whether a step forward moved is in the view before it
(something in front blocks it), so the transcript alone determines every pose.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Literal

import numpy as np
from minigrid.core.constants import IDX_TO_COLOR, IDX_TO_OBJECT, OBJECT_TO_IDX

_UNSEEN = OBJECT_TO_IDX["unseen"]
_EMPTY = OBJECT_TO_IDX["empty"]
_WALL = OBJECT_TO_IDX["wall"]
_DOOR = OBJECT_TO_IDX["door"]
_DOOR_STATES = ("open", "closed", "locked")
_SKIP_IN_SCAN = (_UNSEEN, _EMPTY)
_NOT_OBJECTS = (_UNSEEN, _EMPTY, _WALL)


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _where(dx: int, dy: int) -> str:
    """Position relative to the agent: dx > 0 is right, dy > 0 is forward."""
    side = "left" if dx < 0 else "right"
    if dx == 0:
        return f"{_steps(dy)} forward"
    if dy == 0:
        return f"{_steps(abs(dx))} {side}"
    return f"{_steps(abs(dx))} {side} and {_steps(dy)} forward"


def _words(kind: int, color: int, state: int) -> str:
    """An object's or door's words in a sentence ("red ball", "locked green door")."""
    if kind == _DOOR:
        return f"{_DOOR_STATES[state]} {IDX_TO_COLOR[color]} door"
    return f"{IDX_TO_COLOR[color]} {IDX_TO_OBJECT[kind]}"


def _scan_wall(cells: list[int]) -> int | None:
    """Distance to a wall along `cells` (nearest first), or None when something else comes first."""
    for distance, cell in enumerate(cells, start=1):
        if cell in _SKIP_IN_SCAN:
            continue
        return distance if cell == _WALL else None
    return None


ObservationOrder = Literal["scan", "nearest"]
_SIDE_RANK = {"forward": 0, "left": 1, "right": 2}


def describe(image: np.ndarray, carrying: tuple[str, str] | None = None,
             order: ObservationOrder = "scan") -> list[str]:
    """Sentences for one egocentric view; `carrying` is (colour, type) of the held object."""
    grid = image.tolist()
    width, height = len(grid), len(grid[0])
    ax, ay = width // 2, height - 1
    objects = [[cell[0] for cell in column] for column in grid]
    # (steps, side rank, sentence) in scan order; "nearest" sorts them stably on the first two.
    seen: list[tuple[int, int, str]] = []
    scans = (
        ("forward", [objects[ax][ay - d] for d in range(1, ay + 1)]),
        ("left", [objects[ax - d][ay] for d in range(1, ax + 1)]),
        ("right", [objects[ax + d][ay] for d in range(1, width - ax)]),
    )
    for direction, cells in scans:
        distance = _scan_wall(cells)
        if distance is not None:
            seen.append((distance, _SIDE_RANK[direction], f"You see a wall {_steps(distance)} {direction}"))
    for x in range(width):
        column = grid[x]
        for y in range(height):
            kind, color, state = column[y]
            if kind in _NOT_OBJECTS or (x == ax and y == ay):
                continue
            dx, dy = x - ax, ay - y
            where = _where(dx, dy)
            steps, side = abs(dx) + dy, _SIDE_RANK["forward" if dx == 0 else "left" if dx < 0 else "right"]
            seen.append((steps, side, f"You see a {_words(kind, color, state)} {where}"))
    if order == "nearest":
        seen.sort(key=lambda item: item[:2])
    carried = [f"You carry a {carrying[0]} {carrying[1]}"] if carrying is not None else []
    return carried + [sentence for _, _, sentence in seen]


Cell = tuple[int, int]


def seen_cells(image: np.ndarray, agent_pos: Cell, dir_vec: Cell, right_vec: Cell) -> dict[Cell, str | None]:
    """Every grid cell the view shows, by grid coordinates: the words of its object or door, None
    for floor and wall (the agent's own cell, which shows what it carries, left out)."""
    grid = image.tolist()
    width, height = len(grid), len(grid[0])
    ax, ay = width // 2, height - 1
    cells: dict[Cell, str | None] = {}
    for x in range(width):
        for y in range(height):
            kind, color, state = grid[x][y]
            if kind == _UNSEEN or (x == ax and y == ay):
                continue
            right, forward = x - ax, ay - y
            cell = (agent_pos[0] + forward * dir_vec[0] + right * right_vec[0],
                    agent_pos[1] + forward * dir_vec[1] + right * right_vec[1])
            cells[cell] = None if kind in _NOT_OBJECTS else _words(kind, color, state)
    return cells


def recalled(memory: dict[Cell, str], in_view: Container[Cell], agent_pos: Cell, dir_vec: Cell,
             right_vec: Cell) -> list[str]:
    """"You remember a ..." for each remembered object or door out of view now, at the cell where it
    was last seen relative to the agent's pose, nearest first."""
    lines = []
    for cell, what in memory.items():
        if cell in in_view:
            continue
        dx, dy = cell[0] - agent_pos[0], cell[1] - agent_pos[1]
        forward, right = dx * dir_vec[0] + dy * dir_vec[1], dx * right_vec[0] + dy * right_vec[1]
        lines.append((abs(forward) + abs(right), f"You remember a {what} {_offset(forward, right)}"))
    return [line for _, line in sorted(lines)]


def _offset(forward: int, right: int) -> str:
    """Position from the agent's pose, in the observation sentences' words ('back' for behind)."""
    parts = []
    if right:
        parts.append(f"{_steps(abs(right))} {'right' if right > 0 else 'left'}")
    if forward:
        parts.append(f"{_steps(abs(forward))} {'forward' if forward > 0 else 'back'}")
    return " and ".join(parts) or "here"


def describe_map(grid, agent_pos: tuple[int, int], dir_vec: tuple[int, int],
                 right_vec: tuple[int, int]) -> list[str]:
    """The whole grid's objects and doors relative to the agent's pose, row by row, plus the
    distance to the nearest wall in each direction; the first line names what it is."""
    ax, ay = int(agent_pos[0]), int(agent_pos[1])
    lines = ["Map of the whole level from where you start (only you can see this):"]
    for name, (dx, dy) in (("forward", dir_vec), ("back", (-dir_vec[0], -dir_vec[1])),
                           ("left", (-right_vec[0], -right_vec[1])), ("right", right_vec)):
        x, y, distance = ax + int(dx), ay + int(dy), 1
        while 0 <= x < grid.width and 0 <= y < grid.height:
            cell = grid.get(x, y)
            if cell is not None and cell.type == "wall":
                lines.append(f"A wall {_steps(distance)} {name}")
                break
            x, y, distance = x + int(dx), y + int(dy), distance + 1
    for y in range(grid.height):
        for x in range(grid.width):
            cell = grid.get(x, y)
            if cell is None or cell.type == "wall":
                continue
            dx, dy = x - ax, y - ay
            forward = dx * int(dir_vec[0]) + dy * int(dir_vec[1])
            right = dx * int(right_vec[0]) + dy * int(right_vec[1])
            if cell.type == "door":
                state = "locked" if cell.is_locked else "open" if cell.is_open else "closed"
                lines.append(f"A {state} {cell.color} door {_offset(forward, right)}")
            else:
                lines.append(f"A {cell.color} {cell.type} {_offset(forward, right)}")
    return lines
