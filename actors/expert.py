"""The BabyAI bot as an agent-loop policy: a check of the loop, baselines, and demonstrations."""

from __future__ import annotations

from actors.agent_loop import ChatPrompter, EpisodeState, LoopConfig, Response
from envs.babyai_text.expert import BabyAIExpert
from envs.parser import format_tool_call
from envs.protocol import ToolCall


def _bot_call(ep: EpisodeState, expert: BabyAIExpert) -> str:
    last = ep.history[-1].call.name if ep.history and ep.history[-1].call is not None else None
    # A finished plan ("done") is not a tool: answer with a harmless turn.
    return format_tool_call(ToolCall(expert.act(last) or "turn_left"))


class ExpertPolicy:
    """Answers each episode with the bot's canonical tool call; text only (no trajectory).

    Episodes must run in `BabyAITextEnv`s.
    """

    def respond(self, episodes: list[EpisodeState]) -> list[Response]:
        responses = []
        for ep in episodes:
            if ep.policy_state is None:
                ep.policy_state = BabyAIExpert(ep.env)
            responses.append(Response(_bot_call(ep, ep.policy_state)))
        return responses


class DemonstrationPolicy:
    """The bot's canonical calls as token-level turns in the student's chat format.

    Each response is the call's tokens plus the end-of-turn token, with behaviour log-prob 0
    (the bot is deterministic); prompts are built exactly as `ModelPolicy` builds them, so the
    trajectories are what the student would have seen had it acted like the bot (SFT data).
    """

    def __init__(self, tokenizer, loop: LoopConfig, stop_token: str = "<|im_end|>", policy_version: int = 0) -> None:
        self.tokenizer = tokenizer
        self.prompter = ChatPrompter(tokenizer, loop, stop_token)
        self.policy_version = policy_version

    def respond(self, episodes: list[EpisodeState]) -> list[Response]:
        responses = []
        for ep in episodes:
            if ep.policy_state is None:
                ep.policy_state = (BabyAIExpert(ep.env), None)
            expert, last = ep.policy_state
            text = _bot_call(ep, expert)
            ids = tuple(self.tokenizer.encode(text, add_special_tokens=False)) + (self.prompter.stop_id,)
            response = Response(text, tuple(self.prompter.prompt_ids(ep, last)), ids, (0.0,) * len(ids),
                                policy_version=self.policy_version)
            ep.policy_state = (expert, response)
            responses.append(response)
        return responses
