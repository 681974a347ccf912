"""DAgger's aggregate in the main loop: demonstrations scored by their demonstrator, replay's draws (no Ray)."""

import pytest

from actors.agent_loop import LoopConfig
from actors.rollout_worker import RolloutConfig
from buffer.expansion import expand, to_sequences
from envs.babyai_text import BabyAITextConfig
from envs.prompt import PromptConfig
from jobs.aggregate import rows_by_table, scored_by_demonstrator
from jobs.config import ConfigError, load_config
from jobs.warm_start import WarmStartConfig, demonstrations
from models.loading import ModelConfig, load_tokenizer


def test_a_demonstration_scored_by_its_demonstrator_trains_as_sft_through_the_topk_term():
    """aggregate.num_demonstration_samples: the demonstrations in every main-loop batch go through
    the loss the rest of the batch does; on them the forward KL to the teacher's top-k is the SFT
    loss and the OPD advantage is 0."""
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


def test_replay_draws_map_to_the_tables_they_fall_in():
    assert rows_by_table([3, 0, 2, 4], [8, 0, 3, 2, 5]) == [(0, [0, 2]), (2, [0]), (3, [0, 3])]
    assert rows_by_table([5], []) == []
    with pytest.raises(AssertionError):
        rows_by_table([2, 2], [4])


@pytest.mark.parametrize("overrides, message", [
    (["aggregate.num_demonstration_samples=4", "learner.algorithm.topk_kl_coef=0"], "set learner.algorithm.topk_kl_coef > 0"),
    (["aggregate.num_demonstration_samples=4", "warm_start.num_episodes=0"], "set warm_start.num_episodes > 0"),
    # OPD's sampled-token term weighs each sample by its behaviour policy: no replay past Δmax.
    (["aggregate.num_replayed_samples=4"], "only a loss that ignores the behaviour policy accepts"),
    (["aggregate.num_replayed_samples=4", "learner.algorithm.opd_scale=0", "learner.algorithm.opd_format_coef=0.1"],
     "learner.algorithm opd with these knobs is not one"),
])
def test_an_aggregate_the_loss_cannot_train_is_refused(overrides, message):
    from jobs.train import JobConfig

    with pytest.raises(ConfigError, match=message):
        load_config(JobConfig, "jobs/configs/babyai_opd_tiny.yaml", overrides)
    load_config(JobConfig, "jobs/configs/babyai_opd_tiny.yaml",
                ["aggregate.num_replayed_samples=4", "aggregate.num_demonstration_samples=4", "learner.algorithm.opd_scale=0"])
