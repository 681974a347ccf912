"""DAgger's aggregate (Ross et al., 2011) in the main loop: past data trained again beside the fresh batch.

DAgger trains on every state labelled so far, the expert's own (its demonstrations) and each
round's student states labelled by the expert, not on the last round's alone. With the oracle
teacher and a loss that ignores which policy sampled a sample (OPD with `opd_scale: 0`: only
the forward KL to the teacher's top-k), a labelled turn stays exact training data at any age,
and the main loop can do the same: every learner step trains

    the buffer's batch (fresh, within Δmax)  +  num_demonstration_samples of the warm start's
    demonstrations  +  num_replayed_samples of the batches trained before (the aggregate)

A demonstration is scored by its demonstrator (`scored_by_demonstrator`): the top-k term is its
cross-entropy, SFT. Without this section a run measured on BabyAI-Text lost what its warm start
had taught (docs/babyai_text.md, "The aggregate in the job"). The staleness bound still governs
the buffer: a replayed sample is older than Δmax by design, which only a behaviour-free loss
accepts (`Algorithm.behaviour_free`).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import random
from collections import deque

from pydantic import BaseModel, ConfigDict, Field

from buffer.contracts import Trajectory


class AggregateConfig(BaseModel):
    """Past data in every learner batch of the main loop; the defaults (0, 0) turn it off."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_demonstration_samples: int = Field(default=0, ge=0)
    """Samples of the warm start's demonstrations added to every batch (drawn at random; needs
    warm_start.num_episodes > 0), trained through the forward KL to the teacher's top-k
    (`learner.algorithm.topk_kl_coef` > 0), which on a demonstration is its cross-entropy. A
    demonstration's reverse KL is 0 (behaviour and teacher are both the demonstrator), so a
    step's mean reverse KL counts them as agreeing."""
    num_replayed_samples: int = Field(default=0, ge=0)
    """Samples of the batches trained before added to every batch (drawn at random from the last
    `capacity_samples`); only with a loss that ignores the behaviour policy (opd with
    opd_scale 0: DAgger's relabelling)."""
    capacity_samples: int = Field(default=65_536, ge=1)
    """The replayed samples kept, newest; older ones leave first."""
    seed: int = 0
    """Seed of the draws."""

    @property
    def enabled(self) -> bool:
        return bool(self.num_demonstration_samples or self.num_replayed_samples)

    def check(self, algorithm, num_warm_episodes: int, behaviour_free: bool) -> None:
        """ValueError unless the run can train what this section adds: `algorithm` is the
        learner.algorithm config, `behaviour_free` whether its loss ignores the behaviour policy."""
        if self.enabled and not algorithm.topk_kl_coef:
            raise ValueError("the aggregate's past samples train through the forward KL to the teacher's top-k: "
                             "set learner.algorithm.topk_kl_coef > 0, or aggregate.num_*_samples=0")
        if self.num_demonstration_samples and not num_warm_episodes:
            raise ValueError("aggregate.num_demonstration_samples draws from the warm start's demonstrations: set "
                             "warm_start.num_episodes > 0")
        if self.num_replayed_samples and not behaviour_free:
            raise ValueError(f"aggregate.num_replayed_samples trains samples older than the staleness bound again, "
                             f"which only a loss that ignores the behaviour policy accepts (opd with opd_scale 0); "
                             f"learner.algorithm {algorithm.name} with these knobs is not one")


def scored_by_demonstrator(trajectory: Trajectory, top_k: int) -> Trajectory:
    """A demonstration with its demonstrator as its teacher: each response token has teacher
    log-prob 0 and is the teacher's one top-k candidate (-1 pads the other k - 1), so the forward
    KL to the teacher's top-k is the token's cross-entropy and the OPD advantage (teacher minus
    behaviour log-prob, both 0) is 0."""
    pad = (-1,) * (top_k - 1)
    turns = tuple(dataclasses.replace(
        turn, teacher_logprobs=(0.0,) * len(turn.response_ids),
        teacher_topk_ids=tuple((token, *pad) for token in turn.response_ids),
        teacher_topk_logprobs=((0.0,) * top_k,) * len(turn.response_ids)) for turn in trajectory.turns)
    return dataclasses.replace(trajectory, turns=turns)


def rows_by_table(sizes: list[int], picks: list[int]) -> list[tuple[int, list[int]]]:
    """Indices into the tables of `sizes` laid end to end, as (table, its rows) for each table
    picked from, in table order."""
    out: dict[int, list[int]] = {}
    starts = list(itertools.accumulate(sizes, initial=0))
    for pick in sorted(picks):
        assert 0 <= pick < starts[-1], (pick, starts[-1])
        table = bisect.bisect_right(starts, pick) - 1
        out.setdefault(table, []).append(pick - starts[table])
    return sorted(out.items())


class Aggregate:
    """The tables past data lives in, each put in the object store by the driver (so it outlives
    the buffer actor that put the original), and the draws from them."""

    def __init__(self, config: AggregateConfig, demonstrations: list[Trajectory], top_k: int) -> None:
        import ray

        from buffer.actor import encode_trajectories

        assert config.enabled and top_k > 0, (config, top_k)
        self.config = config
        self.rng = random.Random(config.seed)
        self.demonstrations = None
        """(ref, num_samples) of the scored demonstrations' table; None without them."""
        if config.num_demonstration_samples:
            encoded = encode_trajectories([scored_by_demonstrator(t, top_k) for t in demonstrations])
            self.demonstrations = (ray.put((encoded.data,)), encoded.num_samples)
        self.replayed: deque[tuple[object, int]] = deque()
        """(ref, num_samples) of each batch kept, oldest first."""
        self.num_replayable = 0

    def keep(self, batch) -> None:
        """Keep a trained batch (a SampleBatch of the buffer's) for replay, dropping the oldest past
        `capacity_samples`."""
        import ray

        from buffer.actor import encode_table, fetch_samples

        if not self.config.num_replayed_samples or not batch.num_samples:
            return
        self.replayed.append((ray.put((encode_table(fetch_samples(batch)),)), batch.num_samples))
        self.num_replayable += batch.num_samples
        while self.num_replayable > self.config.capacity_samples:
            self.num_replayable -= self.replayed.popleft()[1]

    def draw(self):
        """The next batch's past data as a SampleBatch: the demonstrations' share, then the
        replayed share (fewer while fewer are kept); None when there is nothing to add."""
        from buffer.actor import SampleBatch

        tables: list[tuple[object, list[int]]] = []
        if self.demonstrations is not None:
            ref, n = self.demonstrations
            tables.append((ref, self.rng.sample(range(n), min(self.config.num_demonstration_samples, n))))
        if self.config.num_replayed_samples and self.num_replayable:
            picks = self.rng.sample(range(self.num_replayable), min(self.config.num_replayed_samples, self.num_replayable))
            refs = [ref for ref, _ in self.replayed]
            tables += [(refs[i], rows) for i, rows in rows_by_table([n for _, n in self.replayed], picks)]
        if not tables:
            return None
        rows = tuple(tuple(sorted(r)) for _, r in tables)  # fetch_samples reads runs of rows as slices
        return SampleBatch(tuple(ref for ref, _ in tables), (0,) * len(tables), rows, tuple((0,) * len(r) for r in rows))
