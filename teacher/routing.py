"""Several teachers, each sample routed to one (multi-teacher OPD).

A job has its default teacher (`teacher`) and any number of routed ones (`teacher_routes`):
a route names a field of the task (`task_type` or `split`) and the values it takes. A
trajectory goes to the first route whose values hold its field, else to the default teacher.
Without a default teacher every task must be routed: `check_routes` refuses a config that
leaves a task type of the environment unrouted, before anything starts.

Routed teachers serve without a resource bundle of their own (a remote server or the oracle:
the CPU work is batching and HTTP); in-process model teachers (hf, vllm) stay the default
teacher, which the resource plan places and replicates. The rollout worker splits each batch by
route (actors/routing.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from actors.routing import DEFAULT_ROUTE
from teacher.registry import teacher_backend
from teacher.service import TeacherConfig


class TeacherRoute(BaseModel):
    """One routed teacher and the samples it scores."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9_-]+$")
    """Its services are the named actors `teacher-<name>`."""
    field: Literal["task_type", "split"] = "task_type"
    values: tuple[str, ...] = Field(min_length=1)
    teacher: TeacherConfig

    @model_validator(mode="after")
    def _no_bundle_needed(self) -> "TeacherRoute":
        if teacher_backend(self.teacher.backend).loads_model:
            raise ValueError(f"routed teacher {self.name!r}: backend {self.teacher.backend!r} needs a resource bundle; "
                             f"routed teachers are remote servers or the oracle (make an in-process model the "
                             f"default `teacher`)")
        return self


def check_routes(routes: tuple[TeacherRoute, ...], has_default: bool, task_types: tuple[str, ...],
                 splits: tuple[str, ...]) -> None:
    """ValueError when names clash, a value is not one the environment has, or (without a
    default teacher) some task type is left unrouted."""
    names = [r.name for r in routes]
    if len(set(names)) != len(names) or DEFAULT_ROUTE in names:
        raise ValueError(f"teacher_routes names must be unique and not {DEFAULT_ROUTE!r}: {names}")
    known = {"task_type": task_types, "split": splits}
    for route in routes:
        unknown = sorted(set(route.values) - set(known[route.field]))
        if unknown:
            raise ValueError(f"teacher_routes[{route.name}]: the environment has no {route.field} {unknown}; "
                             f"it has {list(known[route.field])}")
    if has_default or not routes:
        return
    by_type = {t for r in routes if r.field == "task_type" for t in r.values}
    by_split = {s for r in routes if r.field == "split" for s in r.values}
    if set(splits) <= by_split:
        return
    unrouted = [t for t in task_types if t not in by_type]
    if unrouted:
        raise ValueError(f"task types {unrouted} go to no teacher: route them in teacher_routes or set a "
                         f"default `teacher`")
