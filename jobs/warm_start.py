"""Warm start: behaviour cloning of the environment's expert (the BabyAI bot) before the RL/OPD loop.

The tiny students begin from random weights and would never emit a parsable tool call by
sampling alone (every OPD token advantage is then ~0: the oracle teacher is as uniform as
the student once a response leaves the valid calls). So, as the seeds' "SFT on teacher
successes" baseline does, the run first trains a few epochs of SFT on the bot's successful
episodes, rendered in the student's exact token format (`actors.expert.DemonstrationPolicy`).
These optimizer steps are learner versions like any other; `TrainingRun` counts them apart.

With `num_mixed_samples` the demonstrations stay after the warm start: every learner batch of the
main loop carries that many of them beside the buffer's samples (DAgger's aggregate, Ross et al.
2011: the expert's own states beside the student's, both labelled by the expert), scored by
their demonstrator (`scored_by_demonstrator`), so the same loss that distils the teacher on the
student's states is, on them, SFT (docs/babyai_text.md, "Demonstrations in every batch").
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field

from buffer.contracts import Trajectory


class WarmStartConfig(BaseModel):
    """SFT on expert demonstrations before the main loop; `num_episodes: 0` turns it off."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_episodes: int = Field(default=0, ge=0)
    """Expert episodes to run on the train split (only the successful ones are kept)."""
    first_seed: int = Field(default=500_000_000, ge=0)
    """Seeds first_seed.. of the train split: away from the rollout workers' seeds 0, 1, ..."""
    epochs: int = Field(default=3, ge=1)
    batch_episodes: int = Field(default=8, ge=1)
    """Episodes per optimizer step (each packs into one sequence)."""
    lr: float | None = Field(default=None, gt=0)
    """Learning rate during the warm start; None keeps learner.lr."""
    lr_schedule: Literal["cosine", "constant"] = "cosine"
    """cosine: from `lr` down towards 0 over the warm start's steps. At a constant rate the
    clone's last step lands anywhere in its oscillations: measured on the tiny student (256
    episodes x 3 epochs at 0.002), single steps late in training flip the prediction of the
    `name` token after `{"` (log-prob 0 -> -10.7 with no weight moving more than 0.004), and
    when the last step is one of them every tool call the warm-started policy writes is
    malformed (0.000 on 200 tasks; docs/babyai_text.md, "The warm start's rate decays")."""
    max_wall_s: float | None = Field(default=None, gt=0)
    """The warm start's own wall clock, demonstrations included: its SFT stops at this time even
    with epochs left, and a cosine runs over the time left after the demonstrations, not over
    the steps, so the rate reaches 0 when the time is up. A recipe with a wall-clock budget
    (benchmarks/mixed_hour.py) sets it with `epochs` high enough to fill it. None: `epochs`
    passes over the demonstrations."""
    seed: int = 0
    """Shuffling seed of the epochs."""
    num_mixed_samples: int = Field(default=0, ge=0)
    """Samples of the warm start's demonstrations added to every learner batch of the main loop
    (drawn at random, `seed`), trained through the forward KL to the teacher's top-k
    (`learner.algorithm.topk_kl_coef` > 0), which on a demonstration is its cross-entropy. 0: the
    main loop trains on the buffer's samples alone. A demonstration's reverse KL is 0 (behaviour
    and teacher are both the demonstrator), so a step's mean reverse KL counts them as agreeing."""
    export: bool = False
    """Also save the warm-started policy as a HF directory, `<run.dir>/warm_start_hf` (a common
    starting point for runs that compare algorithms)."""


def demonstrations(config: WarmStartConfig, rollout, env, tokenizer) -> list[Trajectory]:
    """The environment expert's episodes as token-level trajectories (policy version 0);
    `rollout`: the RolloutConfig (split, loop), `env`: the job's EnvConfig."""
    from actors.agent_loop import EpisodeTask
    from actors.expert import demonstrations as expert_demonstrations
    from envs.registry import make_env

    tasks = [EpisodeTask(rollout.split, config.first_seed + i) for i in range(config.num_episodes)]
    return expert_demonstrations(lambda: make_env(env), tasks, tokenizer, rollout.loop,
                                 progress="warm start: expert demonstrations")


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


class DemonstrationMix:
    """The demonstrations kept for the main loop: put in the object store once, `draw` gives the
    next batch's share of them as a SampleBatch (rows of the one table)."""

    def __init__(self, trajectories: list[Trajectory], config: WarmStartConfig, top_k: int) -> None:
        import ray

        from buffer.actor import encode_trajectories

        assert config.num_mixed_samples and top_k > 0, (config.num_mixed_samples, top_k)
        encoded = encode_trajectories([scored_by_demonstrator(t, top_k) for t in trajectories])
        self.ref = ray.put((encoded.data,))
        self.num_samples = encoded.num_samples
        self.num_drawn = min(config.num_mixed_samples, encoded.num_samples)
        self.rng = random.Random(config.seed)

    def draw(self):
        from buffer.actor import SampleBatch

        rows = tuple(sorted(self.rng.sample(range(self.num_samples), self.num_drawn)))
        return SampleBatch((self.ref,), (0,), (rows,), ((0,) * len(rows),))


def epoch_batches(trajectories: list[Trajectory], config: WarmStartConfig) -> Iterator[list[Trajectory]]:
    """`epochs` shuffled passes, `batch_episodes` episodes at a time (the last batch may be smaller)."""
    rng = random.Random(config.seed)
    order = list(trajectories)
    for _ in range(config.epochs):
        rng.shuffle(order)
        for i in range(0, len(order), config.batch_episodes):
            yield order[i:i + config.batch_episodes]


def num_steps(num_demonstrations: int, config: WarmStartConfig) -> int:
    return config.epochs * -(-num_demonstrations // config.batch_episodes)


def progress(step: int, total: int, elapsed_s: float, sft_s: float | None) -> float:
    """How far the SFT is, in [0, 1) while it runs: `step` of `total`, or, with a time budget
    (`sft_s`: max_wall_s less the demonstrations' time), the time spent `elapsed_s`."""
    if sft_s is None:
        return step / total
    return elapsed_s / sft_s if sft_s > 0 else 1.0


def step_lr(progress: float, base: float, config: WarmStartConfig) -> float:
    """The warm start's rate at `progress` in [0, 1) (its steps or its time spent), from `base`
    (`lr` or learner.lr)."""
    assert 0 <= progress < 1, progress
    if config.lr_schedule == "constant":
        return base
    return base * 0.5 * (1 + math.cos(math.pi * progress))
