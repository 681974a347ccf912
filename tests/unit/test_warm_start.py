"""Warm-start demonstrations and their SFT batches (no Ray)."""

import pytest

from actors.agent_loop import LoopConfig
from actors.rollout_worker import RolloutConfig
from buffer.expansion import expand, to_sequences
from envs.babyai_text import BabyAITextConfig
from envs.prompt import PromptConfig
from jobs.warm_start import WarmStartConfig, demonstrations, epoch_batches, num_steps, progress, step_lr
from models.loading import ModelConfig, load_tokenizer


def test_demonstrations_are_successful_packable_bot_episodes():
    tok = load_tokenizer(ModelConfig(path="tiny:nano"))
    rollout = RolloutConfig(loop=LoopConfig(max_turns=6, prompt=PromptConfig(history_window="all")))
    config = WarmStartConfig(num_episodes=12, first_seed=1000)
    demos = demonstrations(config, rollout, BabyAITextConfig(), tok)
    # A 6-turn limit cuts some bot episodes short: only the successes are kept.
    assert 0 < len(demos) < 12 and all(d.success and d.num_turns <= 6 for d in demos)
    assert all(1000 <= d.task_seed < 1012 and d.split == "train" for d in demos)
    sequences = to_sequences([s for d in demos for s in expand(d)])
    assert len(sequences) == len(demos)  # one packed sequence per episode


def test_epoch_batches_cover_every_episode_once_per_epoch():
    items = list(range(10))
    config = WarmStartConfig(num_episodes=10, epochs=3, batch_episodes=4)
    batches = list(epoch_batches(items, config))
    assert len(batches) == num_steps(len(items), config) == 9
    for epoch in range(3):
        assert sorted(x for b in batches[3 * epoch:3 * epoch + 3] for x in b) == items
    assert batches[:3] != batches[3:6]  # reshuffled


def test_the_warm_start_rate_decays_to_near_zero_by_its_last_step_unless_constant():
    cosine, constant = WarmStartConfig(), WarmStartConfig(lr_schedule="constant")
    rates = [step_lr(i / 384, 0.002, cosine) for i in range(384)]
    assert rates[0] == 0.002 and all(a > b for a, b in zip(rates, rates[1:]))
    assert rates[-1] < 1e-4 * 0.002  # the clone's last steps cannot throw it far from where it settled
    assert rates[192] == pytest.approx(0.001)
    assert {step_lr(i / 384, 0.002, constant) for i in range(384)} == {0.002}


def test_a_time_bound_warm_start_runs_its_cosine_over_the_time_left_after_its_demonstrations():
    assert progress(96, 384, elapsed_s=1e6, sft_s=None) == 0.25  # no budget: the steps count
    assert progress(0, 384, elapsed_s=30.0, sft_s=120.0) == 0.25  # a budget: the time does, whatever the step
    assert progress(383, 384, elapsed_s=119.0, sft_s=120.0) < 1 <= progress(384, 384, elapsed_s=120.0, sft_s=120.0)
    assert progress(0, 384, elapsed_s=0.0, sft_s=-5.0) == 1.0  # the demonstrations used up the budget: no SFT
    with pytest.raises(ValueError, match="max_wall_s"):
        WarmStartConfig(max_wall_s=0)

