"""The BabyAI bot as an expert policy over the tool interface."""

from __future__ import annotations

from minigrid.utils.baby_ai_bot import BabyAIBot

from envs.babyai_text.env import ACTION_TO_TOOL, TOOL_TO_ACTION, BabyAITextEnv


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

