"""Episode rewards: outcome and format (docs/algorithms.md §2).

- strict: outcome (+1 success / -1 failure) plus one format term for the episode
  (+0.5 when every turn parsed, else -0.5);
- gentle: outcome (+10 success by default in that recipe) plus -0.1 at each turn that did
  not parse; those turns still acted through the parser's fallback.

A turn-level reward (turn_level, turn_judge) carries each turn's format term: in strict mode the
episode's term on every turn (document 000 v2.1/v2.2: one malformed turn costs every turn of the
episode, the "-1.5" it reports with the failed outcome), in gentle mode the turn's own penalty.

Success always comes from the environment's verifier, never from text matching. An environment
that grades progress (ScienceWorld's 0-100 score) moves a failed episode's outcome linearly from
the failure reward (score 0) towards the success reward (score 100).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator


class RewardConfig(BaseModel):
    """Reward shaping; `format_mode` must match the parser's mode."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format_mode: Literal["strict", "gentle"] = "strict"
    success_reward: float = 1.0
    failure_reward: float = -1.0
    format_ok_reward: float = 0.5
    format_bad_reward: float = -0.5
    gentle_step_penalty: float = -0.1

    @model_validator(mode="after")
    def _check(self) -> "RewardConfig":
        if self.success_reward <= self.failure_reward:
            raise ValueError(
                f"success_reward ({self.success_reward}) must exceed failure_reward ({self.failure_reward})")
        if self.gentle_step_penalty > 0:
            raise ValueError(f"gentle_step_penalty must be <= 0, got {self.gentle_step_penalty}")
        return self

    @classmethod
    def gentle(cls) -> "RewardConfig":
        """The gentle recipe of seed 000 v2.3: success +10, -0.1 per malformed turn."""
        return cls(format_mode="gentle", success_reward=10.0, failure_reward=0.0)


@dataclass(frozen=True)
class EpisodeReward:
    """Rewards of one finished episode."""

    outcome: float
    """Outcome term (success or failure reward)."""
    format: float
    """Format term summed over the episode."""
    per_turn: tuple[float, ...]
    """The format term of each turn's turn-level reward, shape [num_turns] (strict: the episode's
    term on every turn; gentle: the turn's own penalty, which sum to `format`)."""

    @property
    def total(self) -> float:
        """The scalar episode reward used for GRPO advantages."""
        return self.outcome + self.format


def episode_reward(config: RewardConfig, success: bool, turn_well_formed: list[bool],
                   score: float | None = None) -> EpisodeReward:
    """Rewards for an episode given success and, per turn, whether the response parsed.

    `score`: the environment's partial credit in [0, 1] (ScienceWorld), None where it grades
    none. An unfinished task's outcome then lies between `failure_reward` (score 0) and
    `success_reward` (score 1) in proportion; success itself always gives `success_reward`."""
    if score is not None and not 0.0 <= score <= 1.0:
        raise ValueError(f"an environment's score must lie in [0, 1], got {score}")
    outcome = config.success_reward if success else config.failure_reward
    if score is not None and not success:
        outcome += (config.success_reward - config.failure_reward) * score
    if config.format_mode == "strict":
        all_ok = bool(turn_well_formed) and all(turn_well_formed)
        fmt = config.format_ok_reward if all_ok else config.format_bad_reward
        return EpisodeReward(outcome=outcome, format=fmt, per_turn=tuple(fmt for _ in turn_well_formed))
    per_turn = tuple(0.0 if ok else config.gentle_step_penalty for ok in turn_well_formed)
    return EpisodeReward(outcome=outcome, format=sum(per_turn), per_turn=per_turn)
