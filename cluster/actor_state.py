"""Where an actor is in its life, read from Ray's control store (GCS).

A caller whose call went unanswered must tell a hung actor from one that is restarting (a model
load can outlast any call deadline) or that another caller already killed: each kill spends one
of the actor's restarts. The public `ray.util.state.get_actor` goes through the dashboard, which
the embedded default does not start; `ray._private.state.actors` asks the GCS directly (the
dashboard reads the same table) and works on every cluster, so it is used here, and only here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ActorState:
    state: str
    """ALIVE once an incarnation's constructor returned; PENDING_CREATION or RESTARTING while one
    starts; DEAD when it was killed for good or its restarts are spent."""
    num_restarts: int
    """Incarnations after the first: a new value is a new process."""


def actor_state(handle: Any) -> ActorState:
    from ray._private.state import actors

    info = actors(actor_id=handle._actor_id.hex())
    return ActorState(state=info["State"], num_restarts=info["NumRestarts"])
