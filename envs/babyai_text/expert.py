"""The BabyAI bot as an expert policy over the tool interface."""

from __future__ import annotations

from minigrid.utils.baby_ai_bot import BabyAIBot

from envs.babyai_text.env import ACTION_TO_TOOL, TOOL_TO_ACTION, BabyAITextEnv
from envs.parser import format_tool_call
from envs.protocol import ToolCall


class BabyAIExpert:
    """Wraps `BabyAIBot` for the current episode of a `BabyAITextEnv`.

    Create it right after `reset`; call `act(last_tool)` once per step with the tool that
    was actually executed (None on the first step), exactly as `BabyAIBot.replan` expects,
    so the bot can also advise an agent that does not follow it (DAgger-style oracle).
    """

    def __init__(self, env: BabyAITextEnv) -> None:
        self._bot = BabyAIBot(env.level)
        self._done_action = int(env.level.actions.done)

    def act(self, last_tool: str | None = None) -> str | None:
        """The tool the bot would call next, or None when it believes the mission is done."""
        action = self._bot.replan(None if last_tool is None else TOOL_TO_ACTION[last_tool])
        return None if int(action) == self._done_action else ACTION_TO_TOOL[int(action)]


class ExpertPolicy:
    """The bot as an agent-loop policy: answers each episode with its canonical tool call.

    Duck-types `actors.agent_loop.Policy`; episodes must run in `BabyAITextEnv`s.
    """

    def respond(self, episodes, config) -> list[str]:
        texts = []
        for ep in episodes:
            if ep.policy_state is None:
                ep.policy_state = BabyAIExpert(ep.env)
            last = ep.history[-1].call.name if ep.history and ep.history[-1].call is not None else None
            # A finished plan ("done") is not a tool: answer with a harmless turn.
            name = ep.policy_state.act(last) or "turn_left"
            texts.append(format_tool_call(ToolCall(name)))
        return texts
