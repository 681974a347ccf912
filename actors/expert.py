"""An environment's expert as an agent-loop policy: a check of the loop, baselines, and demonstrations."""

from __future__ import annotations

import json
from collections.abc import Callable

from actors.agent_loop import ChatPrompter, EpisodeState, LoopConfig, Response
from envs.parser import format_tool_call
from envs.protocol import Expert, ToolCall


def _expert_call(ep: EpisodeState, expert: Expert) -> ToolCall:
    executed = ep.history[-1].call if ep.history else None
    # An expert without a plan (it thinks the task is done) still has to answer: the first tool,
    # called without arguments, is a harmless turn in the environments we have.
    return expert.act(executed) or ToolCall(ep.env.tools[0]["function"]["name"])


def expert_memory(call: ToolCall) -> str:
    """The expert's working memory: its plan, which is the call it is about to make."""
    arguments = f" with {json.dumps(call.arguments, sort_keys=True)}" if call.arguments else ""
    return f"Plan: call {call.name}{arguments} next."


class _ExpertState:
    """The expert of one episode, its call planned at the memory stage, and its last response."""

    def __init__(self, ep: EpisodeState) -> None:
        self.expert = ep.env.expert()
        if self.expert is None:
            raise ValueError(f"environment {type(ep.env).__name__} has no expert: it cannot demonstrate or be "
                             f"evaluated with policy=expert")
        self.planned: ToolCall | None = None
        self.last: Response | None = None

    def answer(self, ep: EpisodeState) -> str:
        """The text of the expert's response at the episode's current stage."""
        if self.planned is None:
            self.planned = _expert_call(ep, self.expert)
        if ep.stage == "memory":
            return expert_memory(self.planned)
        call, self.planned = self.planned, None
        return format_tool_call(call)


def _state(ep: EpisodeState) -> _ExpertState:
    if ep.policy_state is None:
        ep.policy_state = _ExpertState(ep)
    return ep.policy_state


class ExpertPolicy:
    """Answers each episode with the environment expert's canonical tool call (and, with working
    memory, its plan as the memory); text only (no trajectory)."""

    def respond(self, episodes: list[EpisodeState]) -> list[Response]:
        return [Response(_state(ep).answer(ep)) for ep in episodes]


class DemonstrationPolicy:
    """The expert's canonical calls as token-level turns in the student's chat format.

    Each response is the call's tokens plus the end-of-turn token, with behaviour log-prob 0
    (the expert is deterministic); prompts are built exactly as `ModelPolicy` builds them, so the
    trajectories are what the student would have seen had it acted like the expert (SFT data).
    With working memory, the memory responses are the expert's plan (`expert_memory`).
    """

    def __init__(self, tokenizer, loop: LoopConfig, stop_token: str = "<|im_end|>",
                 policy_version: Callable[[], int] = lambda: 0) -> None:
        self.tokenizer = tokenizer
        self.prompter = ChatPrompter(tokenizer, loop, stop_token)
        self.policy_version = policy_version
        """The version each response is tagged with, asked at every turn: a rollout worker's
        current weights' (the buffer's staleness bound then treats demonstrations like samples)."""

    def respond(self, episodes: list[EpisodeState]) -> list[Response]:
        responses = []
        version = self.policy_version()
        for ep in episodes:
            state = _state(ep)
            prompt = self.prompter.prompt_ids(ep, state.last)
            state.last = self.prompter.canonical_text(state.answer(ep), prompt, version)
            responses.append(state.last)
        return responses
