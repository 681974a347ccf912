"""A uniformly random valid tool call every turn: the floor a learning curve is read against."""

from __future__ import annotations

import random

from actors.agent_loop import EpisodeState, Response
from envs.parser import format_tool_call
from envs.protocol import ToolCall


class RandomPolicy:
    """Answers each episode with a tool drawn uniformly from its environment's tools.

    Text only (no trajectory); argument-free tools only, which is what BabyAI-Text has. The
    draw is seeded by (seed, split, task seed, turn), so a rerun repeats the same episodes.
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def respond(self, episodes: list[EpisodeState]) -> list[Response]:
        responses = []
        for ep in episodes:
            if ep.stage == "memory":
                responses.append(Response("Plan: try a random action."))
                continue
            names = [tool["function"]["name"] for tool in ep.env.tools]
            rng = random.Random(f"{self.seed}:{ep.task.split}:{ep.task.seed}:{ep.task.index}:{len(ep.history)}")
            responses.append(Response(format_tool_call(ToolCall(rng.choice(names)))))
        return responses
