"""The multi-turn agent loop over the `TextEnv` seam, batched across environments.

Each round, every unfinished episode gets a prompt rendered from its task and history; a
policy answers all of them at once (one batched generation for a model); each response is
parsed and, when it yields a call, executed in its environment. An episode ends when the
environment says done or after `max_turns` turns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from actors.engine import InferenceEngine, SamplingConfig
from envs.parser import ToolCallParser
from envs.prompt import HistoryTurn, PromptConfig, render_messages
from envs.protocol import EnvReset, TaskInfo, TextEnv


class LoopConfig(BaseModel):
    """Turn limits and parsing of the agent loop."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_turns: int = Field(default=20, ge=1)
    """LLM-level turn limit (the seeds ran 20 or 30)."""
    parser_mode: Literal["strict", "gentle"] = "strict"
    prompt: PromptConfig = PromptConfig()


@dataclass
class EpisodeState:
    """A running episode: its environment, task and history so far."""

    slot: int
    """Index of the environment (and parser) this episode runs in."""
    env: TextEnv
    reset: EnvReset
    history: list[HistoryTurn] = field(default_factory=list)
    done: bool = False
    success: bool = False
    policy_state: Any = None
    """Per-episode state a policy may keep (the expert keeps its bot here)."""

    @property
    def observation(self) -> str:
        return self.history[-1].observation if self.history else self.reset.observation


@dataclass(frozen=True)
class EpisodeResult:
    """Summary of one finished episode."""

    info: TaskInfo
    """Which task."""
    success: bool
    """Verifier success."""
    num_turns: int
    """Turns the agent took."""
    num_format_errors: int
    """Turns whose response did not parse."""


class Policy(Protocol):
    """Answers a batch of running episodes with one response text each."""

    def respond(self, episodes: list[EpisodeState], config: LoopConfig) -> list[str]:
        ...


class ModelPolicy:
    """A language model behind an `InferenceEngine`, prompted with the tokenizer's chat template."""

    def __init__(self, engine: InferenceEngine, tokenizer, sampling: SamplingConfig) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.sampling = sampling

    def respond(self, episodes: list[EpisodeState], config: LoopConfig) -> list[str]:
        prompts = []
        for ep in episodes:
            messages = render_messages(config.prompt, ep.env.system_prompt, ep.reset.task,
                                       ep.reset.observation, ep.history)
            prompts.append(self.tokenizer.apply_chat_template(
                messages, tools=ep.env.tools, add_generation_prompt=True, tokenize=True, return_dict=False))
        generations = self.engine.generate(prompts, self.sampling)
        return [self.tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in generations]


def run_episodes(make_env: Callable[[], TextEnv], tasks: list[tuple[str, int]], policy: Policy,
                 config: LoopConfig, batch_size: int = 16,
                 on_episode: Callable[[EpisodeResult], None] | None = None) -> list[EpisodeResult]:
    """Run every (split, seed) task once, `batch_size` episodes at a time; results in task order."""
    envs = [make_env() for _ in range(min(batch_size, len(tasks)))]
    parsers = [ToolCallParser(env.tools, config.parser_mode) for env in envs]
    results: list[EpisodeResult | None] = [None] * len(tasks)
    next_task = 0
    running: dict[int, EpisodeState] = {}
    free = list(range(len(envs)))
    while next_task < len(tasks) or running:
        while free and next_task < len(tasks):
            slot = free.pop()
            split, seed = tasks[next_task]
            running[next_task] = EpisodeState(slot=slot, env=envs[slot],
                                              reset=envs[slot].reset(seed=seed, split=split))
            next_task += 1
        order = list(running)
        responses = policy.respond([running[i] for i in order], config)
        for index, text in zip(order, responses):
            ep = running[index]
            _advance(ep, parsers[ep.slot], text, config.max_turns)
            if ep.done:
                result = EpisodeResult(info=ep.reset.info, success=ep.success, num_turns=len(ep.history),
                                       num_format_errors=sum(t.error is not None for t in ep.history))
                results[index] = result
                free.append(ep.slot)
                del running[index]
                if on_episode is not None:
                    on_episode(result)
    return [r for r in results if r is not None]


def _advance(ep: EpisodeState, parser: ToolCallParser, text: str, max_turns: int) -> None:
    parsed = parser.parse(text)
    observation = ep.observation
    if parsed.call is not None:
        step = ep.env.step(parsed.call)
        observation = step.observation
        ep.done, ep.success = step.done, step.success
    ep.history.append(HistoryTurn(response_text=text, call=parsed.call, error=parsed.error,
                                  think=parsed.think, observation=observation))
    if len(ep.history) >= max_turns:
        ep.done = True
