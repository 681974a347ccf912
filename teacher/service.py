"""The teacher-logprob service: a Ray actor that micro-batches scoring requests.

Rollout workers send finished trajectories while OPD is on; each request waits in a queue
until a batch is full (`max_batch_turns`) or the oldest request has waited
`batch_window_s`; the batch is scored in one call on a worker thread, so the actor keeps
accepting requests meanwhile, and each caller gets its trajectories back with
`teacher_logprobs` filled in. Batching across workers is what makes teacher scoring cheap
(benchmarks/teacher_throughput.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections import deque
from typing import Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from actors.vllm_engine import VLLMConfig
from buffer.contracts import Trajectory
from envs.privileged import PrivilegedConfig
from envs.prompt import PromptConfig
from envs.registry import EnvConfig
from models.loading import ModelConfig
from teacher.backends import ScoreRequest, TeacherBackend, TokenScores
from teacher.oracle import OracleConfig
from teacher.privileged import TeacherPromptBuilder
from teacher.registry import BuildContext, TeacherBackendEntry, teacher_backend
from teacher.remote import RemoteConfig


class TeacherConfig(BaseModel):
    """The teacher and how its requests are batched."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: str = "oracle"
    """A registered teacher backend (teacher/registry.py; the shipped ones: teacher/builtin.py)."""
    model: ModelConfig = ModelConfig()
    """Teacher weights (hf and vllm backends); they share the student's tokenizer unless `cross_tokenizer`."""
    cross_tokenizer: bool = False
    """The teacher's tokenizer differs from the student's: it scores the conversation rendered with its own
    chat template and its log-probs are mapped back onto the student's tokens (teacher/cross_tokenizer.py;
    hf, vllm and remote backends (for remote, `model` names the served model's tokenizer); no top-k)."""
    vllm: VLLMConfig = VLLMConfig()
    """How the vllm backend's in-process engine starts (dtype, max_model_len, memory share)."""
    remote: RemoteConfig = RemoteConfig()
    """The server of the remote backend (an OpenAI-compatible API with vLLM's prompt log-probs)."""
    oracle: OracleConfig = OracleConfig()
    privileged: PrivilegedConfig = PrivilegedConfig()
    """Privileged context c+ in the teacher's prompts (model teachers): the same c+ the teacher was
    built with (`jobs.build_teacher` writes it next to the weights and the service checks it)."""
    max_batch_turns: int = Field(default=256, ge=1)
    """Close a batch once it holds this many turns."""
    batch_window_s: float = Field(default=0.02, ge=0)
    """Close a batch once its oldest request waited this long."""
    max_batch_tokens: int = Field(default=32768, ge=1)
    """Token budget of one forward pass (hf backend)."""
    top_k: int = Field(default=0, ge=0)
    """Also return the teacher's top-k tokens at every response position (for `learner.algorithm.topk_kl_coef`);
    0: only the sampled tokens' log-probs."""
    max_restarts: int = Field(default=3, ge=-1)
    """Times Ray restarts a dead teacher service over the job's lifetime (Ray counts them; -1:
    without limit, for long runs); its pending `score` calls are retried on the
    new incarnation (scoring is a pure function of the trajectories, so a retry duplicates nothing)."""

    @model_validator(mode="after")
    def _privileged_needs_a_model(self) -> "TeacherConfig":
        if not teacher_backend(self.backend).scores_text and self.privileged.enabled:
            raise ValueError(f"teacher.privileged is for model teachers: the {self.backend} backend scores tool "
                             f"calls against the environment's expert, which already knows the full state")
        if self.cross_tokenizer:
            if not teacher_backend(self.backend).cross_tokenizer:
                raise ValueError(f"teacher.cross_tokenizer: the {self.backend} backend scores in the student's tokens "
                                 f"only (the hf, vllm and remote backends score across tokenizers)")
            if self.top_k:
                raise ValueError("teacher.cross_tokenizer with teacher.top_k > 0: the teacher's top-k tokens are ids "
                                 "of another vocabulary; set teacher.top_k=0 (and learner.algorithm.topk_kl_coef=0)")
        return self


class TrajectoryScorer(Protocol):
    def score_trajectories(self, trajectories: list[Trajectory], top_k: int = 0) -> list[list[TokenScores]]:
        """TokenScores per turn of each trajectory; with top_k > 0 also the teacher's top-k."""
        ...


class ModelTeacher:
    """A model backend scoring every turn, in the teacher's (possibly privileged) context.

    A full-history episode's turns nest (each prompt extends the previous prompt + response),
    so one forward pass over the last turn scores them all: O(n) tokens per episode instead of
    the O(n^2) of one request per turn. Turns that do not nest are scored on their own.
    """

    def __init__(self, backend: TeacherBackend, prompts: TeacherPromptBuilder | None = None) -> None:
        self.backend = backend
        self.prompts = prompts

    def score_trajectories(self, trajectories: list[Trajectory], top_k: int = 0) -> list[list[TokenScores]]:
        requests: list[ScoreRequest] = []
        # For each turn: (request index, offset of its response in that request's response), or
        # None for an untrainable turn before a run's first trainable one (TCOD-B2F's replayed
        # turns): it is context of the request, never scored.
        where: list[list[tuple[int, int] | None]] = []
        for t in trajectories:
            prompts = [turn.prompt_ids if self.prompts is None else self.prompts.teacher_prompt(turn.prompt_ids, t)
                       for turn in t.turns]
            spots: list[tuple[int, int] | None] = []
            run_start = 0
            for k in range(len(t.turns) + 1):
                nests = 0 < k < len(t.turns) and _extends(prompts[k], prompts[k - 1] + t.turns[k - 1].response_ids)
                if k == len(t.turns) or (k > 0 and not nests):
                    first = next((j for j in range(run_start, k) if t.turns[j].trainable), k)
                    if first < k:
                        head, last = prompts[first], k - 1
                        full = prompts[last] + t.turns[last].response_ids
                        requests.append(ScoreRequest(head, full[len(head):]))
                    spots.extend(None if j < first else (len(requests) - 1, len(prompts[j]) - len(prompts[first]))
                                 for j in range(run_start, k))
                    run_start = k
            where.append(spots)
        scores = self.backend.score(requests, top_k)
        return [[TokenScores.unscored(len(turn.response_ids), top_k) if spot is None
                 else scores[spot[0]].slice(spot[1], spot[1] + len(turn.response_ids))
                 for spot, turn in zip(spots, t.turns)] for spots, t in zip(where, trajectories)]


def _extends(longer: tuple[int, ...], prefix: tuple[int, ...]) -> bool:
    return len(longer) >= len(prefix) and longer[:len(prefix)] == prefix


def check_same_tokenizer(student, teacher) -> None:
    """Teacher log-probs are compared token by token with the student's: the vocabularies must match."""
    if student.get_vocab() != teacher.get_vocab():
        s, t = student.get_vocab(), teacher.get_vocab()
        diff = sorted(set(s.items()) ^ set(t.items()))[:5]
        raise ValueError(f"student and teacher tokenizers differ ({len(s)} vs {len(t)} tokens; e.g. {diff}); "
                         f"OPD scores the student's exact tokens: use a teacher with the student's tokenizer, or "
                         f"set teacher.cross_tokenizer=true to map its log-probs onto them")
    for name in ("eos_token", "pad_token"):
        if getattr(student, name) != getattr(teacher, name):
            raise ValueError(f"student and teacher tokenizers differ in {name}: "
                             f"{getattr(student, name)!r} vs {getattr(teacher, name)!r}")


def with_teacher_logprobs(trajectory: Trajectory, scores: list[TokenScores]) -> Trajectory:
    turns = tuple(dataclasses.replace(turn, teacher_logprobs=s.logprobs, teacher_topk_ids=s.topk_ids,
                                      teacher_topk_logprobs=s.topk_logprobs)
                  for turn, s in zip(trajectory.turns, scores))
    return dataclasses.replace(trajectory, turns=turns)


def build_scorer(config: TeacherConfig, student_model: ModelConfig, env_config: EnvConfig,
                 prompt: PromptConfig = PromptConfig(), entry: TeacherBackendEntry | None = None) -> TrajectoryScorer:
    """The scorer a TeacherService runs: `entry` (default: the registered `config.backend`) built
    with the student's tokenizer, `env_config`'s environment (the one the student played: the
    oracle replays its tasks, privileged context shows its system prompt and tools) and the
    rollout's `prompt` config."""
    from envs.registry import make_env
    from models.loading import load_tokenizer

    entry = entry or teacher_backend(config.backend)
    return entry.build(config, BuildContext(load_tokenizer(student_model), make_env(env_config), prompt))


class TeacherService:
    """Async actor body: `score` requests are micro-batched across callers."""

    def __init__(self, config: TeacherConfig, scorer: TrajectoryScorer, name: str = "teacher-0") -> None:
        from cluster.metrics import ActorMetrics

        self.config = config
        self.scorer = scorer
        self.name = name
        self.metrics = ActorMetrics("teacher", name)
        self._queue: deque[tuple[list[Trajectory], asyncio.Future, float]] = deque()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._latencies: deque[float] = deque(maxlen=2048)
        self._num_requests = self._num_batches = self._num_turns = self._num_rejected = 0
        self._batch_sizes: deque[int] = deque(maxlen=2048)

    def __repr__(self) -> str:  # the dashboard's Repr column
        return f"TeacherService({self.name}, {self.config.backend})"

    async def score(self, trajectories: list[Trajectory]) -> list[Trajectory | None]:
        """The trajectories with teacher log-probs on every turn; None in place of one whose
        scores are not valid log-probs (`TokenScores.valid`): rejected here, where they enter,
        and counted (`num_rejected`), so no NaN reaches a loss."""
        loop = asyncio.get_running_loop()
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._batcher())
        future = loop.create_future()
        self._queue.append((trajectories, future, time.monotonic()))
        self._num_requests += 1
        self._wake.set()
        return await future

    async def _batcher(self) -> None:
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
            oldest = self._queue[0][2]
            while self._queued_turns() < self.config.max_batch_turns:
                remaining = oldest + self.config.batch_window_s - time.monotonic()
                if remaining <= 0:
                    break
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), remaining)
                except TimeoutError:
                    break
            batch, turns = [], 0
            while self._queue and (not batch or turns + sum(t.num_turns for t in self._queue[0][0])
                                   <= self.config.max_batch_turns):
                item = self._queue.popleft()
                batch.append(item)
                turns += sum(t.num_turns for t in item[0])
            try:
                await self._score_batch(batch, turns)
            except Exception as exc:  # noqa: BLE001 - handed to this batch's callers; the batcher serves on
                for _, future, _ in batch:
                    if not future.done():
                        future.set_exception(exc)

    async def _score_batch(self, batch: list, turns: int) -> None:
        """Score one batch of requests and answer each caller. Any failure here, the backend's or
        a malformed answer's, is the batch's alone (`_batcher` hands it to its callers)."""
        trajectories = [t for item in batch for t in item[0]]
        scores = await asyncio.get_running_loop().run_in_executor(None, self.scorer.score_trajectories,
                                                                  trajectories, self.config.top_k)
        if len(scores) != len(trajectories):
            raise ValueError(f"teacher {self.name} returned scores for {len(scores)} of {len(trajectories)} "
                             f"trajectories")
        self._num_batches += 1
        self._num_turns += turns
        self._batch_sizes.append(turns)
        self.metrics.set("teacher_batch_turns", turns)
        answers, i = [], 0
        for trajs, _, _ in batch:  # every answer built before any is sent: a failure fails them all
            answers.append([with_teacher_logprobs(t, s) if all(turn.valid() for turn in s) else None
                            for t, s in zip(trajs, scores[i:i + len(trajs)])])
            i += len(trajs)
        now = time.monotonic()
        for (_, future, start), scored in zip(batch, answers):
            rejected = scored.count(None)
            if rejected:
                self._num_rejected += rejected
                self.metrics.inc("teacher_rejected_trajectories", rejected)
            future.set_result(scored)
            self._latencies.append(now - start)
            self.metrics.observe("teacher_request_seconds", now - start)

    def _queued_turns(self) -> int:
        return sum(t.num_turns for item in self._queue for t in item[0])

    async def stats(self) -> dict[str, float]:
        lat = np.array(self._latencies) if self._latencies else np.zeros(1)
        return {
            "pid": os.getpid(),
            "num_requests": self._num_requests,
            "num_batches": self._num_batches,
            "num_turns_scored": self._num_turns,
            "num_rejected": self._num_rejected,
            "mean_batch_turns": float(np.mean(self._batch_sizes)) if self._batch_sizes else 0.0,
            "queue_depth": len(self._queue),
            "latency_p50_s": float(np.percentile(lat, 50)),
            "latency_p99_s": float(np.percentile(lat, 99)),
        }


class _ServiceActor(TeacherService):
    """Builds its own scorer inside the actor (models load where they run)."""

    def __init__(self, config: TeacherConfig, student_model: ModelConfig, env_config: EnvConfig, name: str,
                 prompt: PromptConfig, entry: TeacherBackendEntry) -> None:
        self.name, self.config = name, config  # the actor's repr, also when building the scorer fails
        super().__init__(config, build_scorer(config, student_model, env_config, prompt, entry), name)


def create_teacher_service(config: TeacherConfig, student_model: ModelConfig, env_config: EnvConfig,
                           name: str = "teacher-0", prompt: PromptConfig = PromptConfig(), named: bool = False,
                           **options):
    """Start a TeacherService actor called `name` (its metrics' actor tag; with `named`, also its
    Ray actor name); `env_config` and `prompt`: the job's environment and the rollout's prompt config."""
    import ray

    options.setdefault("num_cpus", 1)
    options.update(max_restarts=config.max_restarts, max_task_retries=-1)
    if named:
        options["name"] = name
    # The entry travels with the actor: a backend registered by the driver's code alone builds there too.
    return ray.remote(_ServiceActor).options(**options).remote(config, student_model, env_config, name, prompt,
                                                               teacher_backend(config.backend))
