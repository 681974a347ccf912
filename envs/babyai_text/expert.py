"""The BabyAI bot as an expert policy over the tool interface."""

from __future__ import annotations

from typing import Literal

from minigrid.envs.babyai.core.verifier import AfterInstr, BeforeInstr, GoToInstr, OpenInstr, PutNextInstr
from minigrid.utils.baby_ai_bot import BabyAIBot, DisappearedBoxError

from envs.babyai_text.env import ACTION_TO_TOOL, TOOL_TO_ACTION, BabyAITextEnv
from envs.protocol import ToolCall


class BabyAIExpert:
    """Wraps `BabyAIBot` for the current episode of a `BabyAITextEnv`.

    Create it right after `reset` (`BabyAITextEnv.expert()`); call `act` once per executed
    step with the call that was executed (None on the first step), exactly as
    `BabyAIBot.replan` expects, so the bot can also advise an agent that does not follow it
    (DAgger-style oracle).

    `deviation` says what the advice is after a call the bot did not suggest: `undo` is the
    bot's own way (it first plans to undo the call: turn back to the object it wanted, drop what
    was picked up by mistake); `replan` plans afresh from the state reached, keeping the cells the
    bot has seen and the parts of the instruction already done (docs/babyai_text.md, "The bot").
    Where a fresh plan cannot start from that state (an object carried that the remaining
    instruction does not use) the bot undoes as before.
    """

    def __init__(self, env: BabyAITextEnv, deviation: Literal["undo", "replan"] = "undo") -> None:
        self._level = env.level
        self._deviation = deviation
        self._bot: BabyAIBot | None = BabyAIBot(self._level)
        self._done_action = int(self._level.actions.done)
        self._suggested: int | None = None

    def act(self, executed: ToolCall | None = None) -> ToolCall | None:
        """The call the bot would make next; None when it believes the mission is done, or once
        the agent opened a box the bot needed (it has no plan from then on)."""
        if self._bot is None:
            return None
        taken = None if executed is None else TOOL_TO_ACTION[executed.name]
        try:
            if self._deviation == "replan" and taken is not None and taken != self._suggested:
                # The old bot saw what faced the agent before the call: an opened box ends the plan
                # here too (a fresh bot, never told of the call, would plan to take the vanished box).
                self._bot._check_erroneous_box_opening(taken)
                fresh = self._fresh_bot()
                if fresh is not None:
                    self._bot, taken = fresh, None  # a new plan starts as at reset: no action to account for
            action = self._bot.replan(taken)
        except DisappearedBoxError:
            self._bot = None
            return None
        self._suggested = int(action)
        return None if int(action) == self._done_action else ToolCall(ACTION_TO_TOOL[int(action)])

    def _fresh_bot(self) -> BabyAIBot | None:
        """A bot planning the rest of the instruction from the current state, with the old bot's
        map of seen cells; None where the carried object rules a fresh plan out."""
        instr = self._level.instrs
        # The sequences of this level pick up first: Before(pickup A, go to B), After(go to B, pickup A).
        if isinstance(instr, BeforeInstr) and instr.a_done == "success":
            instr = instr.instr_b
        elif isinstance(instr, AfterInstr) and instr.b_done == "success":
            instr = instr.instr_a
        carrying = self._level.carrying
        bot = BabyAIBot(self._level)
        bot.vis_mask = self._bot.vis_mask.copy()
        bot.stack = []
        bot._process_instr(instr)
        if carrying is None or isinstance(instr, (GoToInstr, OpenInstr)):
            return bot  # carrying does not change how to go somewhere; the open plan handles keys
        if isinstance(instr, PutNextInstr) and any(carrying is obj for obj in instr.desc_move.obj_set):
            del bot.stack[-2:]  # already holding what moves: go next to the fixed object and drop
            return bot
        return None
