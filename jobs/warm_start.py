"""Warm start: behaviour cloning of the environment's expert (the BabyAI bot) before the RL/OPD loop.

The tiny students begin from random weights and would never emit a parsable tool call by
sampling alone (every OPD token advantage is then ~0: the oracle teacher is as uniform as
the student once a response leaves the valid calls). So, as the seeds' "SFT on teacher
successes" baseline does, the run first trains a few epochs of SFT on the bot's successful
episodes, rendered in the student's exact token format (`actors.expert.DemonstrationPolicy`).
These optimizer steps are learner versions like any other; `TrainingRun` counts them apart.
The demonstrations may also stay for the main loop's batches (jobs.aggregate).
"""

from __future__ import annotations

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
