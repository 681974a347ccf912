"""The BabyAI bot as an expert policy over the tool interface."""

from __future__ import annotations

from minigrid.utils.baby_ai_bot import BabyAIBot, DisappearedBoxError

from envs.babyai_text.env import ACTION_TO_TOOL, TOOL_TO_ACTION, BabyAITextEnv
from envs.protocol import ToolCall


class BabyAIExpert:
    """Wraps `BabyAIBot` for the current episode of a `BabyAITextEnv`.

    Create it right after `reset` (`BabyAITextEnv.expert()`); call `act` once per executed
    step with the call that was executed (None on the first step), exactly as
    `BabyAIBot.replan` expects, so the bot can also advise an agent that does not follow it
    (DAgger-style oracle).
    """

    def __init__(self, env: BabyAITextEnv) -> None:
        self._bot: BabyAIBot | None = BabyAIBot(env.level)
        self._done_action = int(env.level.actions.done)

    def act(self, executed: ToolCall | None = None) -> ToolCall | None:
        """The call the bot would make next; None when it believes the mission is done, or once
        the agent opened a box the bot needed (it has no plan from then on)."""
        if self._bot is None:
            return None
        try:
            action = self._bot.replan(None if executed is None else TOOL_TO_ACTION[executed.name])
        except DisappearedBoxError:
            self._bot = None
            return None
        return None if int(action) == self._done_action else ToolCall(ACTION_TO_TOOL[int(action)])

