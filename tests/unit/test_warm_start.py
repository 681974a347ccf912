"""Warm-start demonstrations and their SFT batches (no Ray)."""

import pytest

from actors.agent_loop import LoopConfig
from actors.rollout_worker import RolloutConfig
from buffer.expansion import expand, to_sequences
from envs.babyai_text import BabyAITextConfig
from envs.prompt import PromptConfig
from jobs.warm_start import (WarmStartConfig, demonstrations, epoch_batches, num_steps, progress,
                              scored_by_demonstrator, step_lr)
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


def test_a_demonstration_scored_by_its_demonstrator_trains_as_sft_through_the_topk_term():
    """warm_start.num_mixed_samples: the demonstrations in every main-loop batch go through the
    loss the rest of the batch does; on them the forward KL to the teacher's top-k is the SFT loss
    and the OPD advantage is 0."""
    import torch
    from transformers import AutoModelForCausalLM

    from learner.algorithms import AlgorithmConfig, forward_kl_topk, opd_advantages, sft_loss
    from learner.trainer import collate, token_logprobs
    from models.tiny import tiny_model_dir

    tok = load_tokenizer(ModelConfig(path="tiny:nano"))
    rollout = RolloutConfig(loop=LoopConfig(max_turns=6, prompt=PromptConfig(history_window=0)))
    demos = demonstrations(WarmStartConfig(num_episodes=4, first_seed=2000), rollout, BabyAITextConfig(), tok)
    scored = [scored_by_demonstrator(d, top_k=3) for d in demos]
    turn = scored[0].turns[0]
    assert turn.teacher_topk_ids[0] == (turn.response_ids[0], -1, -1) and set(turn.teacher_logprobs) == {0.0}
    batch = collate(to_sequences([s for d in scored for s in expand(d)]), learner_version=0,
                    pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir("nano"))
    logprobs, _, topk = token_logprobs(model, batch, with_topk=True)
    cfg = AlgorithmConfig(opd_scale=0.0, topk_kl_coef=1.0)
    kl, sft = forward_kl_topk(topk, batch, cfg), sft_loss(logprobs, batch, cfg)
    assert kl.num_units == sft.num_units > 0
    assert kl.loss_sum.item() == pytest.approx(sft.loss_sum.item(), rel=1e-5) and sft.loss_sum.item() > 1.0
    assert not opd_advantages(batch, AlgorithmConfig())[batch.loss_mask].any()
