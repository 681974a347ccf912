"""How a rollout worker splits a batch among its teachers: each trajectory goes to the first
route (teacher/routing.py's `TeacherRoute`: a name, a task field and its values) whose values
hold the trajectory's field, else to the default teacher."""

from __future__ import annotations

from buffer.contracts import Trajectory

DEFAULT_ROUTE = "default"
"""Name of the default teacher among the services a worker routes to."""


def route_of(trajectory: Trajectory, routes: tuple) -> str:
    """The name of the teacher that scores `trajectory` (DEFAULT_ROUTE when no route matches)."""
    for route in routes:
        if getattr(trajectory, route.field) in route.values:
            return route.name
    return DEFAULT_ROUTE


def split_by_route(trajectories: list[Trajectory], routes: tuple) -> dict[str, list[int]]:
    """Teacher name -> the indices of the trajectories it scores, in order."""
    parts: dict[str, list[int]] = {}
    for i, trajectory in enumerate(trajectories):
        parts.setdefault(route_of(trajectory, routes), []).append(i)
    return parts


def merge_routed(num_trajectories: int, parts: dict[str, list[int]], scored: list[list[Trajectory]]) -> list:
    """The scored trajectories back in their original order (`scored` in the order of `parts`)."""
    out: list[Trajectory | None] = [None] * num_trajectories
    for indices, results in zip(parts.values(), scored, strict=True):
        assert len(indices) == len(results), "a teacher answered a different number of trajectories"
        for i, trajectory in zip(indices, results):
            out[i] = trajectory
    return out
