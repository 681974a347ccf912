import pytest
from pydantic import ValidationError

from envs.rewards import RewardConfig, episode_reward


def test_strict_outcome_and_format():
    cfg = RewardConfig()
    r = episode_reward(cfg, success=True, turn_well_formed=[True, True])
    assert (r.outcome, r.format, r.total) == (1.0, 0.5, 1.5)
    r = episode_reward(cfg, success=False, turn_well_formed=[True, False])
    assert (r.outcome, r.format, r.total) == (-1.0, -0.5, -1.5)
    assert r.per_turn == (-0.5, -0.5)  # a turn-level reward carries the episode's format term


def test_gentle_penalises_each_bad_turn():
    cfg = RewardConfig.gentle()
    r = episode_reward(cfg, success=True, turn_well_formed=[True, False, False])
    assert r.per_turn == (0.0, -0.1, -0.1)
    assert r.total == pytest.approx(10.0 - 0.2)


def test_bad_config_is_rejected():
    with pytest.raises(ValidationError, match="must exceed"):
        RewardConfig(success_reward=-1, failure_reward=1)
    with pytest.raises(ValidationError, match="extra"):
        RewardConfig(bonus=1)


def test_a_graded_score_moves_a_failed_outcome_between_the_failure_and_success_rewards():
    strict, gentle = RewardConfig(), RewardConfig.gentle()
    assert episode_reward(strict, False, [True], score=0.25).outcome == pytest.approx(-0.5)
    assert episode_reward(strict, False, [True], score=0.0).outcome == strict.failure_reward
    assert episode_reward(strict, True, [True], score=1.0).outcome == strict.success_reward
    assert episode_reward(gentle, False, [True, False], score=0.5).total == pytest.approx(5.0 - 0.1)
    assert episode_reward(strict, False, [True]).outcome == strict.failure_reward  # no score: success alone
    with pytest.raises(ValueError, match=r"score must lie in \[0, 1\], got 1.5"):
        episode_reward(strict, False, [True], score=1.5)
