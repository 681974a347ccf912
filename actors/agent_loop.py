"""The multi-turn agent loop over the `TextEnv` seam, batched across environments.

Each round, every unfinished episode asks the policy for a response, all at once (one
batched generation for a model); or, with continuous batching (`EpisodeRunner.advance`),
each episode asks as soon as its environment has answered and its request joins the
engine's running batch. Each response is parsed and, when it yields a call, executed in
its environment. An episode ends when the environment says done, after
`max_turns` turns, or when its prompt no longer fits the context (recorded as a
truncation). Model responses are recorded as `Turn`s and every finished episode becomes
a `Trajectory`.

Token-in, token-out: the prompt of turn k+1 is the prompt of turn k, the response tokens
exactly as generated, and the tokens of what the chat template adds after them (the tool
response and the next generation prompt) -- never a decode/re-encode of the response. Only
when the history window drops turns (or the template rewrites earlier turns) is the prompt
re-rendered from messages; buffer.expansion detects those episodes before packing.

Working memory (`LoopConfig.working_memory`, docs/algorithms.md §7) splits each environment
step in two stages, both recorded as trainable turns with their stage tag:

    memory stage:  [system, task + last memory + window, memory request] -> notes (own token budget)
    action stage:  [system, task + new memory  + window]                 -> tool call -> env.step

The memory changes every step, so no prompt extends the previous one: every prompt is
rendered from messages, and the window, not the whole episode, bounds its length.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from actors.engine import Generation, InferenceEngine, SamplingConfig, stream_generations
from buffer.contracts import Trajectory, Turn, are_logprobs
from envs.parser import CALL_OPEN, ToolCallParser, format_tool_call
from envs.privileged import PrivilegedConfig, PrivilegedContext
from envs.prompt import HistoryTurn, PromptConfig, render_messages, template_tools
from envs.protocol import EnvCrashed, EnvReset, EnvStep, TaskInfo, TextEnv, ToolCall
from envs.rewards import EpisodeReward, RewardConfig, episode_reward


class LoopConfig(BaseModel):
    """Turn limits, parsing, prompting and rewards of the agent loop."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_turns: int = Field(default=20, ge=1)
    """LLM-level turn limit (the seeds ran 20 or 30)."""
    max_context_tokens: int = Field(default=4096, ge=16)
    """Prompt + response limit; an episode whose prompt no longer fits ends as truncated."""
    parser_mode: Literal["strict", "gentle"] = "strict"
    prompt: PromptConfig = PromptConfig()
    rewards: RewardConfig = RewardConfig()
    privileged: PrivilegedConfig = PrivilegedConfig()
    """Privileged context c+ in the policy's own system turn: only for building a RetireOPD teacher
    (jobs.build_teacher); a student never reads it."""
    working_memory: bool = False
    """Two-stage turns: the policy writes its working memory, then acts from it and the last
    `prompt.history_window` turns (seed 000 v3.1)."""
    memory_max_new_tokens: int = Field(default=64, ge=1)
    """Token budget of a memory response (the action's is the sampling's `max_new_tokens`)."""


@dataclass(frozen=True)
class EpisodeTask:
    """One episode to run."""

    split: str
    """Split of the task."""
    seed: int
    """Seed of the task in its split."""
    group_id: str = ""
    """GRPO group: the G episodes of one (split, seed) share it."""
    index: int = 0
    """Position of the episode in its group."""
    max_turns: int | None = None
    """Turn limit of this episode, replayed turns included (TCOD); None: the loop's `max_turns`."""
    replay: tuple[ToolCall, ...] = ()
    """Expert calls that open the episode before the policy acts (TCOD-B2F): recorded as
    untrainable turns, in the prompt exactly as if the policy had made them."""
    horizon_k: int | None = None
    """TCOD horizon k in force, recorded on the trajectory; None without a curriculum."""

    @property
    def trajectory_id(self) -> str:
        return f"{self.group_id or f'{self.split}:{self.seed}'}/{self.index}"


@dataclass(frozen=True)
class Response:
    """A policy's answer for one episode."""

    text: str
    """Decoded response (what the parser reads)."""
    prompt_ids: tuple[int, ...] | None = None
    """Prompt tokens the engine saw; None for text-only policies (no trajectory is recorded)."""
    response_ids: tuple[int, ...] = ()
    """Generated tokens, stop token included when hit."""
    logprobs: tuple[float, ...] = ()
    """Sampling log-prob per generated token."""
    finish_reason: str = "stop"
    """'stop', 'length', or 'context' (the prompt no longer fits: nothing was generated)."""
    policy_version: int = 0
    """Version of the weights that started generating the response. Under continuous batching
    (`EpisodeRunner.advance`) new weights can load mid-response: its later tokens are then
    sampled by newer weights, and `logprobs` are those of the weights that sampled each token,
    so the loss's importance ratios stay exact; this oldest version is what staleness counts."""
    replayed: bool = False
    """An expert call replayed into the episode (TCOD-B2F), not the policy's: never trained."""

    @property
    def finite(self) -> bool:
        """Whether every sampling log-prob is one (`buffer.contracts.are_logprobs`). A response the
        engine reports otherwise still acts in the environment, but is never trained on: its
        importance ratios would be NaN or infinite (rejected where it enters)."""
        return are_logprobs(self.logprobs)

    @property
    def trainable_logprobs(self) -> tuple[float, ...]:
        """The log-probs a turn records: zeros in place of a non-finite response's, so no NaN
        reaches a batch even masked (NaN x 0 is NaN)."""
        return self.logprobs if self.finite else tuple(0.0 for _ in self.logprobs)


@dataclass
class EpisodeState:
    """A running episode: its environment, task and history so far."""

    slot: int
    """Index of the environment (and parser) this episode runs in."""
    task: EpisodeTask
    env: TextEnv
    reset: EnvReset
    history: list[HistoryTurn] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    done: bool = False
    success: bool = False
    score: float | None = None
    """The environment's latest partial credit in [0, 1] (`EnvStep.score`); None where it grades none."""
    truncated: str | None = None
    """Why the episode was cut short by the loop: 'max_turns' or 'context'; None otherwise."""
    policy_state: Any = None
    """Per-episode state a policy may keep (the model's token context, the expert's bot)."""
    tag: Any = None
    """The caller's label for this episode, returned with its result."""
    privileged: str = ""
    """Privileged context c+ ending the system turn (`LoopConfig.privileged`); '' for a student."""
    stage: str = "action"
    """What the next response is: 'action', or 'memory' (working memory, before the action)."""
    memory: str | None = None
    """The latest working memory; None before the first (or without working memory)."""
    well_formed: list[bool] = field(default_factory=list)
    """Per response, memory stages included: whether it had the stage's format."""

    @property
    def observation(self) -> str:
        return self.history[-1].observation if self.history else self.reset.observation


AGENT_FAILED = "agent_failed"
"""`EpisodeResult.truncated` of an episode whose agent program failed (actors.gateway: it crashed,
exited without a reward, or timed out): a failure, whatever it had done."""


@dataclass(frozen=True)
class EpisodeResult:
    """One finished episode."""

    task: EpisodeTask
    """What was run."""
    info: TaskInfo
    """Which task it was."""
    success: bool
    """Verifier success."""
    num_turns: int
    """Turns the agent took."""
    num_format_errors: int
    """Turns whose response did not parse."""
    reward: EpisodeReward
    """Outcome and format rewards."""
    truncated: str | None
    """'max_turns' or 'context' when the loop cut the episode short; AGENT_FAILED."""
    trajectory: Trajectory | None
    """Token-level record; None for text-only policies."""


class Policy(Protocol):
    """Answers a batch of running episodes with one response each."""

    def respond(self, episodes: list[EpisodeState]) -> list[Response]:
        ...


class ChatPrompter:
    """Prompt token ids of an episode's next turn, from the tokenizer's chat template.

    Given the previous turn's `Response`, the prompt extends it token-for-token (see the
    module docstring); otherwise it is rendered from messages.
    """

    def __init__(self, tokenizer, loop: LoopConfig, stop_token: str = "<|im_end|>") -> None:
        self.tokenizer = tokenizer
        self.loop = loop
        self.stop_token = stop_token
        self.stop_id = tokenizer.convert_tokens_to_ids(stop_token)
        if self.stop_id is None or self.stop_id == tokenizer.unk_token_id:
            raise ValueError(f"end-of-turn token {stop_token!r} is not in the tokenizer's vocabulary")

    def _render(self, messages, ep: EpisodeState, generation_prompt: bool, tokenize: bool):
        return self.tokenizer.apply_chat_template(messages, tools=template_tools(self.loop.prompt, ep.env.tools),
                                                  add_generation_prompt=generation_prompt,
                                                  tokenize=tokenize, return_dict=False)

    def prompt_ids(self, ep: EpisodeState, last: Response | None) -> list[int]:
        messages = render_messages(self.loop.prompt, ep.env.system_prompt, ep.reset.task, ep.reset.observation,
                                   ep.history, tools=ep.env.tools, system_extra=ep.privileged,
                                   working_memory=ep.memory, memory_request=ep.stage == "memory")
        window = self.loop.prompt.history_window
        if (not self.loop.working_memory and last is not None and last.prompt_ids is not None
                and (window == "all" or len(ep.history) <= window)):
            tail = self._tail_ids(messages, ep)
            if tail is not None:
                closed = last.response_ids if last.finish_reason == "stop" else last.response_ids + (self.stop_id,)
                return list(last.prompt_ids + closed) + tail
        return self._render(messages, ep, generation_prompt=True, tokenize=True)

    def canonical_response(self, call: ToolCall, prompt_ids: list[int], policy_version: int,
                           replayed: bool = False) -> Response:
        """`call` in its canonical text as a response with log-prob 0 per token (the expert is
        deterministic): its tokens are what the tokenizer gives the text, plus the end-of-turn token."""
        return self.canonical_text(format_tool_call(call), prompt_ids, policy_version, replayed)

    def canonical_text(self, text: str, prompt_ids: list[int], policy_version: int,
                       replayed: bool = False) -> Response:
        """`text` as a response: its tokens plus the end-of-turn token, log-prob 0 per token."""
        ids = tuple(self.tokenizer.encode(text, add_special_tokens=False)) + (self.stop_id,)
        return Response(text, tuple(prompt_ids), ids, (0.0,) * len(ids), policy_version=policy_version,
                        replayed=replayed)

    def _tail_ids(self, messages, ep: EpisodeState) -> list[int] | None:
        """Tokens the template adds after the last assistant turn's end-of-turn token."""
        tail = template_tail(self._render(messages[:-1], ep, generation_prompt=False, tokenize=False),
                             self._render(messages, ep, generation_prompt=True, tokenize=False), self.stop_token)
        return None if tail is None else self.tokenizer.encode(tail, add_special_tokens=False)


def template_tail(before: str, after: str, stop_token: str) -> str | None:
    """What a chat template adds after the last end-of-turn token of `before` (messages ending
    with an assistant turn), given `after` (the same messages and more, rendered with the
    generation prompt); None when `after` does not extend `before` (the template rewrote history).
    """
    end = before.rfind(stop_token)
    if not after.startswith(before) or end < 0:
        return None
    return before[end + len(stop_token):] + after[len(before):]


class ModelPolicy:
    """A language model behind an `InferenceEngine`, prompted with the tokenizer's chat template."""

    def __init__(self, engine: InferenceEngine, tokenizer, sampling: SamplingConfig, loop: LoopConfig,
                 stop_token: str = "<|im_end|>") -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.loop = loop
        self.prompter = ChatPrompter(tokenizer, loop, stop_token)

    def respond(self, episodes: list[EpisodeState]) -> list[Response]:
        responses: list[Response | None] = [None] * len(episodes)
        batches: dict[int, tuple[SamplingConfig, list[tuple[int, list[int]]]]] = {}
        version = self.engine.version
        for i, ep in enumerate(episodes):
            asked = self.request(ep)
            if isinstance(asked, Response):
                responses[i] = asked
            else:
                prompt, sampling = asked
                batches.setdefault(sampling.max_new_tokens, (sampling, []))[1].append((i, prompt))
        for sampling, items in batches.values():
            generations = self.engine.generate([prompt for _, prompt in items], sampling)
            for (i, prompt), g in zip(items, generations):
                responses[i] = self.response(episodes[i], prompt, g, version)
        return responses

    def request(self, ep: EpisodeState) -> Response | tuple[list[int], SamplingConfig]:
        """What an episode's next turn needs: a response at once (an expert call replayed, or
        no room left in the context), or a generation of (prompt ids, sampling)."""
        prompt = self.prompter.prompt_ids(ep, ep.policy_state)
        if len(ep.history) < len(ep.task.replay):
            ep.policy_state = self.prompter.canonical_response(
                ep.task.replay[len(ep.history)], prompt, self.engine.version, replayed=True)
            return ep.policy_state
        room = self.loop.max_context_tokens - len(prompt)
        if room < 1:
            return Response("", tuple(prompt), finish_reason="context", policy_version=self.engine.version)
        budget = self.loop.memory_max_new_tokens if ep.stage == "memory" else self.sampling.max_new_tokens
        return prompt, self.sampling.model_copy(update={"max_new_tokens": min(budget, room)})

    def response(self, ep: EpisodeState, prompt: list[int], g: Generation, version: int) -> Response:
        """The response a generation for `request`'s prompt makes; `version`: the engine's when it started."""
        ep.policy_state = Response(
            text=self.tokenizer.decode(g.token_ids, skip_special_tokens=True), prompt_ids=tuple(prompt),
            response_ids=g.token_ids, logprobs=g.logprobs, finish_reason=g.finish_reason, policy_version=version)
        return ep.policy_state


class Pending:
    """An environment call in flight: `wait()` returns its result, `ready()` says whether it is in."""

    def __init__(self, wait: Callable[[], Any], ready: Callable[[], bool] = lambda: True) -> None:
        self.wait, self.ready = wait, ready


class EpisodeRunner:
    """Episodes in flight over a fixed set of environment slots, advanced in batched rounds
    (`step`) or by continuous batching (`advance`, the rollout worker's default).

    A round generates for every episode whose environment has answered, then submits their calls.
    In-process environments answer at once, so every running episode takes part in every round.
    Environments in their own processes (actors.env_actor) answer later: an episode whose step
    (or game load) is still running sits the round out instead of holding the batch back, and
    a round waits only when no episode is ready at all. `advance` asks for each episode's next
    turn the moment its environment answers, with the same bookkeeping.
    """

    def __init__(self, make_env: Callable[[], TextEnv], num_slots: int, config: LoopConfig) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.config = config
        self._envs = [make_env() for _ in range(num_slots)]
        self._parsers = [ToolCallParser(env.tools, config.parser_mode) for env in self._envs]
        self._free = list(range(num_slots))[::-1]
        self.running: list[EpisodeState] = []
        self._starting: list[tuple[int, EpisodeTask, Any, Pending]] = []
        """Episodes whose environment reset was submitted: (slot, task, tag, the reset)."""
        self._acting: dict[int, tuple[Response, Any, Pending]] = {}
        """Slot -> (response, parsed, the environment step in flight) of episodes awaiting their environment."""
        self._finished: list[tuple[Any, EpisodeResult]] = []
        self._stream: Iterator | None = None
        """`advance`'s engine stream, suspended between calls with turns still generating."""
        self._generating: set[int] = set()
        """Slots of episodes whose turn is in the stream."""
        self.num_env_restarts = 0
        """Episodes started over because their environment's process died."""
        self._context = PrivilegedContext(config.privileged) if config.privileged.enabled else None
        if self._context is not None:
            self._context.check(self._envs[0])

    @property
    def num_free(self) -> int:
        return len(self._free)

    def close(self) -> None:
        """Abort the turns `advance` left generating (the environments outlive the runner: a
        worker reuses its environment actors)."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    @property
    def num_active(self) -> int:
        """Episodes starting or running."""
        return len(self.running) + len(self._starting)

    def start(self, task: EpisodeTask, tag: Any = None) -> None:
        """Reset a free environment for `task`; `tag` comes back with the result."""
        self.start_many([(task, tag)])

    def start_many(self, tasks: list[tuple[EpisodeTask, Any]]) -> None:
        """Reset a free environment for each (task, tag); each episode joins once its reset is in."""
        if len(tasks) > len(self._free):
            raise RuntimeError(f"{len(tasks)} tasks for {len(self._free)} free environment slots")
        for task, tag in tasks:
            slot = self._free.pop()
            self._starting.append((slot, task, tag, _submit(self._envs[slot], "reset", task.seed, task.split)))
        self._collect(block=False)

    def _episode(self, slot: int, task: EpisodeTask, tag: Any, reset: EnvReset) -> EpisodeState:
        env = self._envs[slot]
        privileged = "" if self._context is None else self._context.text(env, reset)
        ep = EpisodeState(slot=slot, task=task, env=env, reset=reset, tag=tag, privileged=privileged)
        ep.stage = _next_stage(ep, self.config)
        return ep

    def _restart(self, slot: int, task: EpisodeTask, tag: Any) -> EpisodeState:
        """Its environment's process died: the episode starts over in the restarted one (it was
        not delivered yet, so it is neither lost nor recorded twice)."""
        self.num_env_restarts += 1
        return self._episode(slot, task, tag, _reset_until_up(self._envs[slot], task))

    def _collect(self, block: bool) -> None:
        """Take in every environment answer that is in (with `block`, wait for the oldest first
        when none is): advance those episodes, join the started ones."""
        if block and not any(p.ready() for *_, p in self._starting) and \
                not any(p.ready() for _, _, p in self._acting.values()):
            oldest = next(iter(self._acting.values()), None)
            try:
                (oldest[2] if oldest is not None else self._starting[0][3]).wait()
            except EnvCrashed:
                pass  # taken in below, with the episode it belongs to
        still = []
        for ep in self.running:
            acting = self._acting.get(ep.slot)
            if acting is None or not acting[2].ready():
                still.append(ep)
                continue
            response, parsed, pending = self._acting.pop(ep.slot)
            try:
                step = pending.wait()
            except EnvCrashed:
                still.append(self._restart(ep.slot, ep.task, ep.tag))
                continue
            _advance(ep, response, parsed, step, ep.task.max_turns or self.config.max_turns, self.config)
            if ep.done:
                self._finished.append((ep.tag, finish_episode(ep, self.config.rewards)))
                self._free.append(ep.slot)
            else:
                still.append(ep)
        starting = []
        for slot, task, tag, pending in self._starting:
            if not pending.ready():
                starting.append((slot, task, tag, pending))
                continue
            try:
                still.append(self._episode(slot, task, tag, pending.wait()))
            except EnvCrashed:
                still.append(self._restart(slot, task, tag))
        self.running, self._starting = still, starting

    def step(self, policy: Policy) -> list[tuple[Any, EpisodeResult]]:
        """One round: every episode whose environment has answered gets one response; returns
        (tag, result) of the episodes that finished since the last call."""
        self._collect(block=False)
        ready = [ep for ep in self.running if ep.slot not in self._acting]
        if not ready and (self._acting or self._starting):
            self._collect(block=True)
            ready = [ep for ep in self.running if ep.slot not in self._acting]
        if ready:
            try:
                responses = policy.respond(ready)
            except EnvCrashed:  # a policy that asks the environment (the expert) found one dead
                dead = {ep.slot for ep in ready if not _alive(ep.env)}
                self.running = [self._restart(ep.slot, ep.task, ep.tag) if ep.slot in dead else ep
                                for ep in self.running]
                finished, self._finished = self._finished, []
                return finished
            # Every environment call of the round is submitted before any is awaited.
            for ep, response in zip(ready, responses):
                self._respond(ep, response)
            self._collect(block=False)
        finished, self._finished = self._finished, []
        return finished

    def advance(self, policy: ModelPolicy, interrupt: Callable[[], bool]) -> list[tuple[Any, EpisodeResult]]:
        """Continuous batching, where `step` goes in rounds: an episode's next turn is asked for
        as soon as its environment has answered and joins the engine's running batch (an engine
        without one answers in rounds: actors.engine.stream_generations). Returns (tag, result)
        of the episodes finished since the last call once there are some, or once `interrupt()`
        (asked after each turn) says the caller needs the thread: new weights to load, room for
        new episodes. The other episodes' turns stay in the engine, generating on the next call;
        weights loaded meanwhile take over mid-turn (`Response.policy_version`)."""
        if self._stream is None:
            self._stream = stream_generations(policy.engine, lambda: self._requests(policy))
        for (slot, prompt, version), g in self._stream:
            self._generating.discard(slot)
            ep = next(ep for ep in self.running if ep.slot == slot)
            self._respond(ep, policy.response(ep, prompt, g, version))
            self._collect(block=False)
            if self._finished or interrupt():
                break
        else:  # no turn in the engine and none ready: the episodes left wait on their environments
            self._stream = None
            if self._acting or self._starting:
                self._collect(block=True)
        finished, self._finished = self._finished, []
        return finished

    def _requests(self, policy: ModelPolicy) -> list[tuple[tuple[int, list[int], int], list[int], SamplingConfig]]:
        """The stream's next requests, keyed (slot, prompt, the engine's version): the turns of the
        episodes whose environment has answered. A response that needs no generation (a replayed
        expert call) is acted on at once, and the episode asked again."""
        requests = []
        asked_again = True
        while asked_again:
            asked_again = False
            self._collect(block=False)
            for ep in self.running:
                if ep.slot in self._acting or ep.slot in self._generating:
                    continue
                asked = policy.request(ep)
                if isinstance(asked, Response):
                    self._respond(ep, asked)
                    asked_again = True
                else:
                    self._generating.add(ep.slot)
                    requests.append(((ep.slot, asked[0], policy.engine.version), *asked))
        return requests

    def _respond(self, ep: EpisodeState, response: Response) -> None:
        """Submit the environment call a response makes (taken in by `_collect`)."""
        parsed, pending = _act(ep, self._parsers[ep.slot], response)
        self._acting[ep.slot] = (response, parsed, pending)


def run_episodes(make_env: Callable[[], TextEnv], tasks: list[EpisodeTask], policy: Policy, config: LoopConfig,
                 batch_size: int = 16, progress: str | None = None, runner: Callable[..., Any] | None = None
                 ) -> list[EpisodeResult]:
    """Run every task once, `batch_size` episodes at a time; results in task order. `progress`:
    the label of a progress bar on stderr (None: no bar); `runner`: the runner class (None:
    `EpisodeRunner`; an environment's own, envs.registry.env_runner, e.g. the gateway's)."""
    runner = (runner or EpisodeRunner)(make_env, min(batch_size, max(len(tasks), 1)), config)
    try:
        return play_episodes(runner, tasks, policy, progress)
    finally:
        runner.close()


def play_episodes(runner, tasks: list[EpisodeTask], policy: Policy, progress: str | None = None
                  ) -> list[EpisodeResult]:
    """Every task once on a runner (an `EpisodeRunner` or an environment's own), as many at a time
    as it has free slots; results in task order."""
    import sys

    from tqdm import tqdm

    pending = list(enumerate(tasks))[::-1]
    results: list[EpisodeResult | None] = [None] * len(tasks)
    with tqdm(total=len(tasks), desc=progress, unit="ep", file=sys.stderr, disable=progress is None) as bar:
        while pending or runner.num_active:
            runner.start_many([(task, index) for index, task in
                               (pending.pop() for _ in range(min(len(pending), runner.num_free)))])
            for index, result in runner.step(policy):
                results[index] = result
                bar.update()
    return [r for r in results if r is not None]


def _next_stage(ep: EpisodeState, config: LoopConfig) -> str:
    """'memory' before each action of the policy's own (a replayed expert call needs no memory)."""
    return "memory" if config.working_memory and len(ep.history) >= len(ep.task.replay) else "action"


def memory_well_formed(text: str) -> bool:
    """A memory is notes: not empty, and no tool call (an action written there is never executed)."""
    return bool(text.strip()) and CALL_OPEN not in text


def _submit(env: TextEnv, method: str, *args) -> Pending:
    """`env.<method>(*args)`, started now (an environment with `submit_<method>` runs it elsewhere)."""
    submit = getattr(env, f"submit_{method}", None)
    if submit is not None:
        return submit(*args)
    value = getattr(env, method)(*args)
    return Pending(lambda: value)


def _alive(env: TextEnv) -> bool:
    """False when the process that holds the environment's episode is gone (in-process
    environments always live)."""
    lost = getattr(env, "episode_lost", None)
    return lost is None or not lost()


def _reset_until_up(env: TextEnv, task: EpisodeTask, attempts: int = 60, wait_s: float = 1.0) -> EnvReset:
    """Reset `task` in an environment whose process is being restarted."""
    import time

    for _ in range(attempts - 1):
        try:
            return env.reset(seed=task.seed, split=task.split)
        except EnvCrashed:
            time.sleep(wait_s)
    return env.reset(seed=task.seed, split=task.split)


def _act(ep: EpisodeState, parser: ToolCallParser, response: Response):
    """(parsed response, the environment's step in flight: its result is None when nothing acted)."""
    if response.finish_reason == "context" or ep.stage == "memory":
        return None, Pending(lambda: None)
    parsed = parser.parse(response.text)
    if parsed.call is None and parser.mode == "gentle":
        recovered = ep.env.recover(response.text)  # the environment's state may name it (ALFWorld)
        if recovered is not None:
            parsed = replace(parsed, call=recovered)
    if parsed.call is None:
        return parsed, Pending(lambda: None)
    return parsed, _submit(ep.env, "step", parsed.call)


def _advance(ep: EpisodeState, response: Response, parsed, step: EnvStep | None, max_turns: int,
             config: LoopConfig) -> None:
    if response.finish_reason == "context":
        ep.done, ep.truncated = True, "context"
        return
    if ep.stage == "memory":
        ep.memory = response.text.strip()
        ep.stage = "action"
        ok = memory_well_formed(response.text)
        ep.well_formed.append(ok)
        if response.prompt_ids is not None:
            ep.turns.append(Turn(turn_index=len(ep.turns), prompt_ids=response.prompt_ids,
                                 response_ids=response.response_ids, behaviour_logprobs=response.trainable_logprobs,
                                 policy_version=response.policy_version, well_formed=ok, trainable=response.finite,
                                 finish_reason=response.finish_reason, stage="memory"))
        return
    observation = ep.observation
    if step is not None:
        observation = step.observation
        ep.done, ep.success, ep.score = step.done, step.success, step.score
    ep.history.append(HistoryTurn(response_text=response.text, call=parsed.call, error=parsed.error,
                                  think=parsed.think, observation=observation))
    if response.prompt_ids is not None:
        ep.turns.append(Turn(turn_index=len(ep.turns), prompt_ids=response.prompt_ids,
                             response_ids=response.response_ids, behaviour_logprobs=response.trainable_logprobs,
                             policy_version=response.policy_version, well_formed=parsed.well_formed,
                             trainable=not response.replayed and response.finite,
                             finish_reason=response.finish_reason,
                             executed_call=None if parsed.call is None else
                             json.dumps({"name": parsed.call.name, "arguments": parsed.call.arguments})))
    ep.well_formed.append(parsed.well_formed)
    if not ep.done and len(ep.history) >= max_turns:
        ep.done, ep.truncated = True, "max_turns"
    ep.stage = _next_stage(ep, config)


def finish_episode(ep: EpisodeState, rewards: RewardConfig) -> EpisodeResult:
    """The result of an episode that ended: its reward from `ep.success`, `ep.score` and the format of each response."""
    well_formed = ep.well_formed
    reward = episode_reward(rewards, ep.success, well_formed, score=ep.score)
    trajectory = None
    if ep.turns:
        turns = tuple(Turn(**{**t.__dict__, "turn_reward": r}) for t, r in zip(ep.turns, reward.per_turn))
        trajectory = _trajectory(ep, turns, ep.success, reward.outcome, reward.format)
    return EpisodeResult(task=ep.task, info=ep.reset.info, success=ep.success, num_turns=len(ep.history),
                         num_format_errors=sum(not ok for ok in well_formed), reward=reward,
                         truncated=ep.truncated, trajectory=trajectory)


def running_trajectory(ep: EpisodeState) -> Trajectory:
    """The turns a running episode has finished so far, before any outcome: success False, rewards 0."""
    return _trajectory(ep, tuple(ep.turns), False, 0.0, 0.0)


def _trajectory(ep: EpisodeState, turns: tuple[Turn, ...], success: bool, outcome: float, format_reward: float
                ) -> Trajectory:
    return Trajectory(trajectory_id=ep.task.trajectory_id, group_id=ep.task.group_id or
                      ep.task.trajectory_id.rsplit("/", 1)[0], split=ep.task.split, task_seed=ep.task.seed,
                      task_type=ep.reset.info.task_type, turns=turns, success=success, outcome_reward=outcome,
                      format_reward=format_reward, horizon_k=ep.task.horizon_k, task=ep.reset.task)
