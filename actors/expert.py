"""An environment's expert as an agent-loop policy: a check of the loop, baselines, and demonstrations."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import replace

from actors.agent_loop import ChatPrompter, EpisodeState, EpisodeTask, LoopConfig, Response, run_episodes
from buffer.contracts import Trajectory
from envs.parser import format_tool_call
from envs.protocol import Expert, TextEnv, ToolCall


def _planned_call(ep: EpisodeState, expert: Expert) -> ToolCall | None:
    """The expert's next call, advised of the call executed last; None where it has no plan."""
    executed = ep.history[-1].call if ep.history else None
    return expert.act(executed)


def _harmless_call(ep: EpisodeState) -> ToolCall:
    # An expert without a plan (it thinks the task is done) still has to answer: the first tool,
    # called without arguments, is a harmless turn in the environments we have.
    return ToolCall(ep.env.tools[0]["function"]["name"])


def _expert_call(ep: EpisodeState, expert: Expert) -> ToolCall:
    return _planned_call(ep, expert) or _harmless_call(ep)


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
        self.called: ToolCall | None = None
        """The call of the last tool-call answer."""
        self.expert_done = False
        """Whether the expert had no plan at the last answer (it answered the harmless first tool)."""

    def answer(self, ep: EpisodeState) -> str:
        """The text of the expert's response at the episode's current stage."""
        if self.planned is None:
            planned = _planned_call(ep, self.expert)
            self.expert_done = planned is None
            self.planned = planned or _harmless_call(ep)
        if ep.stage == "memory":
            return expert_memory(self.planned)
        self.called, self.planned = self.planned, None
        return format_tool_call(self.called)


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

    With `noise` > 0 (DART, Laskey et al. 2017) each tool call is, with that probability, another
    tool drawn uniformly: the response's text is the call executed and its tokens the expert's
    call at the state (the label), so the episode visits states off the expert's path (facing a
    distractor, holding the wrong object) labelled with what the expert would do there
    (docs/babyai_text.md, "Off the bot's path"). A turn and its tokens are then sound SFT data only
    where later prompts do not show past responses (`prompt.history_window: 0`). An episode whose
    expert has no plan left before its end (the agent opened a box the plan needed) has no labels
    from then on: it is listed in `unlabelled` by (split, seed).
    """

    def __init__(self, tokenizer, loop: LoopConfig, stop_token: str = "<|im_end|>",
                 policy_version: Callable[[], int] = lambda: 0, noise: float = 0.0, seed: int = 0) -> None:
        assert 0 <= noise < 1, noise
        self.tokenizer = tokenizer
        self.prompter = ChatPrompter(tokenizer, loop, stop_token)
        self.policy_version = policy_version
        """The version each response is tagged with, asked at every turn: a rollout worker's
        current weights' (the buffer's staleness bound then treats demonstrations like samples)."""
        self.noise = noise
        self._rng = random.Random(seed)
        self.unlabelled: set[tuple[str, int]] = set()

    def respond(self, episodes: list[EpisodeState]) -> list[Response]:
        responses = []
        version = self.policy_version()
        for ep in episodes:
            state = _state(ep)
            prompt = self.prompter.prompt_ids(ep, state.last)
            text = state.answer(ep)
            state.last = self.prompter.canonical_text(text, prompt, version)
            if self.noise and ep.stage != "memory":
                if state.expert_done:
                    self.unlabelled.add((ep.task.split, ep.task.seed))
                if self._rng.random() < self.noise:
                    names = [tool["function"]["name"] for tool in ep.env.tools]
                    executed = format_tool_call(ToolCall(self._rng.choice([n for n in names if n != state.called.name])))
                    state.last = replace(state.last, text=executed)
            responses.append(state.last)
        return responses


def demonstrations(make_env: Callable[[], TextEnv], tasks: list[EpisodeTask], tokenizer, loop: LoopConfig,
                   noise: float = 0.0, seed: int = 0, progress: str | None = None) -> list[Trajectory]:
    """The expert's episodes of `tasks` as SFT data: the successful ones, or with `noise` every one
    whose expert kept a plan to its end (off its path the expert may run out of turns and still
    have labelled every state it saw)."""
    policy = DemonstrationPolicy(tokenizer, loop, noise=noise, seed=seed)
    results = run_episodes(make_env, tasks, policy, loop, batch_size=32, progress=progress)
    if not noise:
        return [r.trajectory for r in results if r.success]
    return [r.trajectory for r in results if (r.task.split, r.task.seed) not in policy.unlabelled]
