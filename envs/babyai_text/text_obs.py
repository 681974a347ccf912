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
"""

from __future__ import annotations

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
            what = (f"{_DOOR_STATES[state]} {IDX_TO_COLOR[color]} door" if kind == _DOOR
                    else f"{IDX_TO_COLOR[color]} {IDX_TO_OBJECT[kind]}")
            seen.append((steps, side, f"You see a {what} {where}"))
    if order == "nearest":
        seen.sort(key=lambda item: item[:2])
    carried = [f"You carry a {carrying[0]} {carrying[1]}"] if carrying is not None else []
    return carried + [sentence for _, _, sentence in seen]


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
