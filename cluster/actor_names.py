"""Named actors handed to restartable actors by name rather than by handle.

A handle among a restartable actor's constructor arguments makes Ray log an error line at its
creation ("has constructor arguments in the object store and max_restarts > 0", core_worker.cc:
the handle is a nested reference that a restart would need). The job's services are named
actors of its namespace, so a rollout worker (max_restarts=-1) receives their names and looks
them up in its constructor: at the first start and at every restart alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ActorName:
    """A named actor of the caller's Ray namespace."""

    name: str

    def get(self) -> Any:
        import ray

        return ray.get_actor(self.name)


def resolve(actor: Any) -> Any:
    """The handle of an ActorName, or `actor` itself (a handle, or None)."""
    return actor.get() if isinstance(actor, ActorName) else actor
