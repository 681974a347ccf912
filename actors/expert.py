"""The BabyAI bot as an agent-loop policy (a check of the loop, demonstrations, baselines)."""

from __future__ import annotations

from actors.agent_loop import EpisodeState, Response
from envs.babyai_text.expert import BabyAIExpert
from envs.parser import format_tool_call
from envs.protocol import ToolCall


class ExpertPolicy:
    """Answers each episode with the bot's canonical tool call; text only (no trajectory).

    Episodes must run in `BabyAITextEnv`s.
    """

    def respond(self, episodes: list[EpisodeState]) -> list[Response]:
        responses = []
        for ep in episodes:
            if ep.policy_state is None:
                ep.policy_state = BabyAIExpert(ep.env)
            last = ep.history[-1].call.name if ep.history and ep.history[-1].call is not None else None
            # A finished plan ("done") is not a tool: answer with a harmless turn.
            name = ep.policy_state.act(last) or "turn_left"
            responses.append(Response(format_tool_call(ToolCall(name))))
        return responses
