"""The judge service: a Ray actor giving the selected turns of each finished group a judged reward.

The worker's group-end pipeline awaits it like the teacher stage (so generation of the next
round goes on while turns are judged). For every trainable turn of every trajectory the backend
scores s in [0, 1] -- the environment's expert (`oracle`) or a judge model over HTTP (`http`,
judge.http) -- concurrently, through a cache keyed by the episode's tokens and the turn; the turn's reward becomes

    r = outcome_weight · R_outcome + judge_weight · (2s − 1) + the turn's own format term,

so a judged turn is on the outcome's ±1 scale (seed 000: 0.5·outcome + 0.5·judge; judge only
with outcome_weight 0). A turn whose score could not be had (the server failed or never
answered in the tag, after its retries) gets s = 0.5, the neutral 0 judge term, and is counted;
it never fails the worker. A wrong API key is a config error at start-up (`check`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections import OrderedDict
from typing import Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from buffer.contracts import Trajectory
from models.vllm_server import ServerConfig
from envs.registry import EnvConfig
from judge.http import HttpJudgeConfig
from judge.registry import JudgeBackendEntry, judge_backend
from models.loading import ModelConfig


class JudgeConfig(BaseModel):
    """Which judge scores turns, and how its score enters the turn reward."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: str = "oracle"
    """A registered judge backend (judge/registry.py): the shipped 'oracle', the environment's expert
    (judge/oracle.py), and 'http', a judge model behind an OpenAI-compatible API (judge/http.py)."""
    http: HttpJudgeConfig = HttpJudgeConfig()
    serve: ServerConfig | None = None
    """Start `vllm serve` of `serve.model` on 127.0.0.1 inside the judge's actor (its bundle is the
    plan's `judge` role) and judge through it: `http.base_url` and `http.model` then point at it.
    None: `http.base_url` is a server that runs elsewhere."""
    outcome_weight: float = Field(default=0.5, ge=0)
    judge_weight: float = Field(default=0.5, ge=0)
    cache_size: int = Field(default=65536, ge=0)
    """(episode, turn) scores kept: the same episode delivered again is not judged twice; a group
    re-run after a worker restart (same ids, new tokens) is (`episode_digest`)."""
    max_restarts: int = Field(default=3, ge=-1)
    """Times Ray restarts a dead judge service over the job's lifetime (-1: without limit); pending
    calls are retried on the new incarnation."""

    @model_validator(mode="after")
    def _some_weight(self) -> "JudgeConfig":
        if self.outcome_weight == 0 and self.judge_weight == 0:
            raise ValueError("judge.outcome_weight and judge.judge_weight are both 0: every turn reward would be "
                             "its format term alone")
        entry = judge_backend(self.backend)  # an unknown name fails here, naming the known ones
        if self.serve is not None and entry.served is None:
            raise ValueError(f"judge.serve starts a judge model server: the {self.backend} backend cannot judge "
                             f"through one (judge.backend=http can)")
        return self


class JudgeBackend(Protocol):
    async def check(self) -> None:
        """Raise ValueError when the judge cannot serve (unreachable, wrong key, unknown model)."""
        ...

    async def score(self, trajectory: Trajectory, turn: int) -> float | None:
        """Score of `turn` in [0, 1]; None when none could be had."""
        ...

    async def close(self) -> None:
        ...


NEUTRAL = 0.5


def episode_digest(trajectory: Trajectory) -> bytes:
    """What the judge saw of an episode, as a cache key: its id and every token of it (the last
    turn's prompt holds the ones before). A group re-run after a worker restart keeps its
    trajectory ids but is a new episode, which must be judged again."""
    last = trajectory.turns[-1]
    digest = hashlib.blake2b(trajectory.trajectory_id.encode(), digest_size=16)
    digest.update(np.asarray(last.prompt_ids, dtype=np.int64).tobytes())
    digest.update(np.asarray(last.response_ids, dtype=np.int64).tobytes())
    return digest.digest()


def judged_reward(config: JudgeConfig, trajectory: Trajectory, turn: int, score: float) -> float:
    return (config.outcome_weight * trajectory.outcome_reward + config.judge_weight * (2 * score - 1)
            + trajectory.turns[turn].turn_reward)


class JudgeService:
    """Async actor body (also usable in-process): `judge` sets the judged reward of every trainable turn."""

    def __init__(self, config: JudgeConfig, backend: JudgeBackend, name: str = "judge") -> None:
        from cluster.metrics import ActorMetrics

        self.config = config
        self.backend = backend
        self.name = name
        self.metrics = ActorMetrics("judge", name)
        self._cache: OrderedDict[tuple[bytes, int], float | None] = OrderedDict()
        self._stats = {"num_turns_judged": 0, "num_neutral": 0, "num_cache_hits": 0}

    def __repr__(self) -> str:  # the dashboard's Repr column
        return f"JudgeService({self.name}, {self.config.backend})"

    async def check(self) -> None:
        await self.backend.check()

    async def _score(self, trajectory: Trajectory, turn: int) -> float:
        key = (episode_digest(trajectory), turn)
        if key in self._cache:
            self._stats["num_cache_hits"] += 1
            score = self._cache[key]
        else:
            score = await self.backend.score(trajectory, turn)
            if score is not None and not 0.0 <= score <= 1.0:  # NaN too: rejected here, judged neutral
                score = None
            self._stats["num_turns_judged"] += 1
            self.metrics.inc("judge_turns", 1, result="ok" if score is not None else "neutral")
            if self.config.cache_size:
                self._cache[key] = score
                while len(self._cache) > self.config.cache_size:
                    self._cache.popitem(last=False)
        if score is None:
            self._stats["num_neutral"] += 1
            return NEUTRAL
        return score

    async def judge(self, trajectories: list[Trajectory]) -> list[Trajectory]:
        """The trajectories with judged rewards on their trainable turns (others unchanged); a memory
        turn gets its action's score plus its own format term."""
        out = []
        for t in trajectories:
            steps = t.env_steps()
            action_of = {step: k for k, (step, turn) in enumerate(zip(steps, t.turns)) if turn.stage == "action"}
            # A working-memory turn is judged by the action it led to (its step's score).
            judged = {k: action_of.get(steps[k], k) for k, turn in enumerate(t.turns) if turn.trainable}
            asked = sorted(set(judged.values()))
            scores = dict(zip(asked, await asyncio.gather(*(self._score(t, k) for k in asked))))
            rewards = {k: judged_reward(self.config, t, k, scores[j]) for k, j in judged.items()}
            out.append(dataclasses.replace(t, turns=tuple(
                dataclasses.replace(turn, turn_reward=rewards[k]) if k in rewards else turn
                for k, turn in enumerate(t.turns))))
        return out

    def stats(self) -> dict[str, int]:
        """Counters since the service started: turns judged, neutral (unscored) turns, cache hits."""
        return dict(self._stats)


class _ServiceActor(JudgeService):
    def __init__(self, config: JudgeConfig, model: ModelConfig, env: EnvConfig, name: str,
                 entry: JudgeBackendEntry) -> None:
        if config.serve is not None:
            from models.vllm_server import VLLMServer

            # The server's process group dies with this actor (cluster/reaper.py): a restarted judge starts its own.
            self.server = VLLMServer(config.serve).wait_ready()
            config = entry.served(config, self.server.url, self.server.model_dir)
        super().__init__(config, entry.build(config, model, env), name)


def create_judge_service(config: JudgeConfig, model: ModelConfig, env: EnvConfig, name: str = "judge",
                         named: bool = False, **options):
    """Start the judge service actor (`named`: also its Ray actor name)."""
    import ray

    options.setdefault("num_cpus", 0)
    options.update(max_restarts=config.max_restarts, max_task_retries=-1)
    if named:
        options["name"] = name
    # The entry travels with the actor: a backend registered by the driver's code alone builds there too.
    return ray.remote(_ServiceActor).options(**options).remote(config, model, env, name,
                                                               judge_backend(config.backend))
