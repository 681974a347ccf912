"""An environment's expert as an agent-loop policy: a check of the loop, baselines, and demonstrations."""

from __future__ import annotations

from actors.agent_loop import ChatPrompter, EpisodeState, LoopConfig, Response
from envs.parser import format_tool_call
from envs.protocol import Expert, ToolCall


def _expert_call(ep: EpisodeState, expert: Expert) -> ToolCall:
    executed = ep.history[-1].call if ep.history else None
    # An expert without a plan (it thinks the task is done) still has to answer: the first tool,
    # called without arguments, is a harmless turn in the environments we have.
    return expert.act(executed) or ToolCall(ep.env.tools[0]["function"]["name"])


def _new_expert(ep: EpisodeState) -> Expert:
    expert = ep.env.expert()
    if expert is None:
        raise ValueError(f"environment {type(ep.env).__name__} has no expert: it cannot demonstrate or be evaluated "
                         f"with policy=expert")
    return expert


class ExpertPolicy:
    """Answers each episode with the environment expert's canonical tool call; text only (no trajectory)."""

    def respond(self, episodes: list[EpisodeState]) -> list[Response]:
        responses = []
        for ep in episodes:
            if ep.policy_state is None:
                ep.policy_state = _new_expert(ep)
            responses.append(Response(format_tool_call(_expert_call(ep, ep.policy_state))))
        return responses


class DemonstrationPolicy:
    """The expert's canonical calls as token-level turns in the student's chat format.

    Each response is the call's tokens plus the end-of-turn token, with behaviour log-prob 0
    (the expert is deterministic); prompts are built exactly as `ModelPolicy` builds them, so the
    trajectories are what the student would have seen had it acted like the expert (SFT data).
    """

    def __init__(self, tokenizer, loop: LoopConfig, stop_token: str = "<|im_end|>", policy_version: int = 0) -> None:
        self.tokenizer = tokenizer
        self.prompter = ChatPrompter(tokenizer, loop, stop_token)
        self.policy_version = policy_version

    def respond(self, episodes: list[EpisodeState]) -> list[Response]:
        responses = []
        for ep in episodes:
            if ep.policy_state is None:
                ep.policy_state = (_new_expert(ep), None)
            expert, last = ep.policy_state
            response = self.prompter.canonical_response(_expert_call(ep, expert), self.prompter.prompt_ids(ep, last),
                                                        self.policy_version)
            ep.policy_state = (expert, response)
            responses.append(response)
        return responses
