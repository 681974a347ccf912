"""Losses on small hand-computed tensors: sign, masking, normalisation, clipping."""

import asyncio
import dataclasses
import math

import pytest
import torch
from pydantic import ValidationError

from buffer.contracts import Trajectory, Turn
from learner.algorithms import (ALGORITHMS, AlgorithmConfig, JointConfig, StageContext, TokenBatch, TurnLevelConfig,
                                group_advantages, parse_algorithm_config, select_turns)


def batch(behaviour, adv=None, teacher=None, mask=None, turn_rewards=None):
    b = torch.tensor(behaviour, dtype=torch.float32)
    n, t = b.shape
    return TokenBatch(
        input_ids=torch.zeros(n, t, dtype=torch.long), attention_mask=torch.ones(n, t, dtype=torch.long),
        loss_mask=torch.ones(n, t, dtype=torch.bool) if mask is None else torch.tensor(mask),
        behaviour_logprobs=b, teacher_logprobs=None if teacher is None else torch.tensor(teacher),
        advantages=torch.zeros(n, t) if adv is None else torch.tensor(adv, dtype=torch.float32),
        turn_rewards=torch.zeros(n, t) if turn_rewards is None else torch.tensor(turn_rewards, dtype=torch.float32),
        staleness=torch.zeros(n, t, dtype=torch.long))


def test_grpo_on_policy_gradient_follows_the_advantage():
    cfg = AlgorithmConfig(name="grpo")
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    b = batch([[-1.0, -2.0]], adv=[[1.0, -0.5]])
    out = ALGORITHMS["grpo"].loss(logp, b, cfg)
    assert out.num_units == 2 and out.loss_sum.item() == pytest.approx(-(1.0 - 0.5))  # ratio 1
    out.loss_sum.backward()
    assert logp.grad[0].tolist() == pytest.approx([-1.0, 0.5])  # descending raises the A>0 token


def test_masked_tokens_do_not_count():
    cfg = AlgorithmConfig(name="grpo")
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    b = batch([[-1.0, -2.0, -3.0]], adv=[[1.0, 5.0, 1.0]], mask=[[True, False, True]])
    out = ALGORITHMS["grpo"].loss(logp, b, cfg)
    assert out.num_units == 2 and out.loss_sum.item() == pytest.approx(-2.0)
    out.loss_sum.backward()
    assert logp.grad[0, 1].item() == 0.0


def test_ppo_clip_and_truncation():
    cfg = AlgorithmConfig(name="grpo", clip_eps_low=0.2, clip_eps_high=0.2)
    # ratio e^0.5 = 1.65 with A > 0: clipped at 1.2 -> no gradient, counted as clipped.
    logp = torch.tensor([[-0.5]], requires_grad=True)
    out = ALGORITHMS["grpo"].loss(logp, batch([[-1.0]], adv=[[2.0]]), cfg)
    assert out.loss_sum.item() == pytest.approx(-1.2 * 2.0) and out.stats["clip_frac"] == 1
    out.loss_sum.backward()
    assert logp.grad.item() == 0.0
    # ratio 1.65 with A < 0: the unclipped (worse) branch is kept.
    out = ALGORITHMS["grpo"].loss(torch.tensor([[-0.5]]), batch([[-1.0]], adv=[[-1.0]]), cfg)
    assert out.loss_sum.item() == pytest.approx(math.exp(0.5))
    # TIS caps the ratio first.
    capped = AlgorithmConfig(name="grpo", tis_cap=1.5)
    out = ALGORITHMS["grpo"].loss(torch.tensor([[-0.5]]), batch([[-1.0]], adv=[[-1.0]]), capped)
    assert out.loss_sum.item() == pytest.approx(1.5)


def test_decoupled_clips_from_the_proximal_policy_and_weights_by_its_ratio_to_the_behaviour():
    # A stale token: pi_theta/mu = e^0.5 = 1.65. Coupled, the clip at 1.2 cuts its gradient off
    # (nothing this step did moved it there); decoupled, the weight 1.65 (capped at 1.5 with
    # tis_cap) multiplies an unclipped policy gradient.
    b = batch([[-1.0, -1.0]], adv=[[2.0, -1.0]])
    for cap, weight in ((None, math.exp(0.5)), (1.5, 1.5)):
        cfg = AlgorithmConfig(name="grpo", clip_eps_low=0.2, clip_eps_high=0.2, decoupled=True, tis_cap=cap)
        logp = torch.tensor([[-0.5, -0.5]], requires_grad=True)
        out = ALGORITHMS["grpo"].loss(logp, b, cfg)
        assert out.loss_sum.item() == pytest.approx(-weight * (2.0 - 1.0)) and out.stats["clip_frac"] == 0
        out.loss_sum.backward()
        assert logp.grad[0].tolist() == pytest.approx([-weight * 2.0, weight * 1.0])
        assert out.stats["truncated_frac"] == (2 if cap else 0)
        assert out.stats["ratio_mean"] == pytest.approx(2 * math.exp(0.5)) and out.stats["ratio_max"] == \
            pytest.approx(math.exp(0.5))
    coupled = ALGORITHMS["grpo"].loss(torch.tensor([[-0.5, -0.5]], requires_grad=True), b,
                                      AlgorithmConfig(name="grpo", clip_eps_low=0.2, clip_eps_high=0.2))
    assert coupled.stats["clip_frac"] == 1  # the A > 0 token: clipped, no gradient


def test_token_and_sequence_masks_leave_out_what_leaves_their_band_and_keep_the_units():
    # Row 0: ratios e^0.1, e^1, e^-0.1 (geometric mean e^(1/3) = 1.40); row 1: e^-1, 1, 1 (mean 0.72).
    b = batch([[-1.1, -2.0, -0.9], [0.0, -1.0, -1.0]], adv=[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    logp = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]], requires_grad=True)
    icepop = AlgorithmConfig(name="grpo", clip_eps_low=10.0, clip_eps_high=10.0, token_mask_band=(0.5, 2.0))
    out = ALGORITHMS["grpo"].loss(logp, b, icepop)
    assert out.num_units == 6 and out.stats["masked_frac"] == 2  # e^1 and e^-1 leave [0.5, 2]
    out.loss_sum.backward()
    assert (logp.grad == 0).tolist() == [[False, True, False], [True, False, False]]
    seq = AlgorithmConfig(name="grpo", clip_eps_low=10.0, clip_eps_high=10.0, seq_mask_band=(0.8, 1.25))
    logp.grad = None
    out = ALGORITHMS["grpo"].loss(logp, b, seq)
    assert out.num_units == 6 and out.stats["masked_frac"] == 6  # 1.40 and 0.72 both leave [0.8, 1.25]
    assert out.loss_sum.item() == 0.0
    wide = AlgorithmConfig(name="grpo", clip_eps_low=10.0, clip_eps_high=10.0, seq_mask_band=(0.7, 1.5))
    out = ALGORITHMS["grpo"].loss(logp, b, wide)
    assert out.stats["masked_frac"] == 0
    with pytest.raises(ValueError, match=r"needs 0 < low < 1 < high, got \[1.2, 2.0\]"):
        AlgorithmConfig(name="grpo", token_mask_band=(1.2, 2.0))


def test_the_masks_apply_to_opd_and_its_reverse_kl_still_counts_every_token():
    cfg = AlgorithmConfig(name="opd", token_mask_band=(0.5, 2.0))
    b = batch([[-1.0, -3.0]], teacher=[[-2.0, -2.0]])
    out = ALGORITHMS["opd"].loss(torch.tensor([[-1.0, -1.0]]), b, cfg)  # ratios 1 and e^2
    assert out.stats["masked_frac"] == 1 and out.stats["reverse_kl"] == pytest.approx(1.0 + -1.0)
    assert out.loss_sum.item() == pytest.approx(-(-1.0))  # only the first token: A = -2 - (-1)


def test_seq_mean_weights_sequences_equally():
    cfg = AlgorithmConfig(name="sft", aggregation="seq_mean")
    logp = torch.tensor([[-1.0, -3.0], [-2.0, 0.0]])
    out = ALGORITHMS["sft"].loss(logp, batch([[0, 0], [0, 0]], mask=[[True, True], [True, False]]), cfg)
    assert out.num_units == 2 and out.loss_sum.item() == pytest.approx(2.0 + 2.0)
    token = ALGORITHMS["sft"].loss(logp, batch([[0, 0], [0, 0]], mask=[[True, True], [True, False]]), AlgorithmConfig(name="sft"))
    assert token.num_units == 3 and token.loss_sum.item() == pytest.approx(6.0)


def test_opd_advantage_is_teacher_minus_behaviour_and_logs_reverse_kl():
    cfg = AlgorithmConfig(name="opd", opd_scale=1.0)
    logp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    b = batch([[-1.0, -1.0]], teacher=[[-0.2, -3.0]])
    out = ALGORITHMS["opd"].loss(logp, b, cfg)
    # A = [0.8, -2.0] at ratio 1.
    assert out.loss_sum.item() == pytest.approx(-(0.8 - 2.0))
    assert out.stats["reverse_kl"] == pytest.approx((-1.0 + 0.2) + (-1.0 + 3.0))
    out.loss_sum.backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.8, 2.0])  # teacher-preferred token goes up
    with pytest.raises(ValueError, match="teacher log-probs"):
        ALGORITHMS["opd"].loss(logp, batch([[-1.0, -1.0]]), cfg)


def test_opd_scale_zero_leaves_the_top_k_forward_kl_alone():
    cfg = AlgorithmConfig(name="opd", opd_scale=0.0, topk_kl_coef=1.0)
    logp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    out = ALGORITHMS["opd"].loss(logp, batch([[-1.0, -1.0]], teacher=[[-0.2, -3.0]]), cfg)
    out.loss_sum.backward()
    assert out.loss_sum.item() == 0.0 and logp.grad.abs().sum().item() == 0.0  # no sampled-token term
    with pytest.raises(ValidationError, match="opd_scale: 0 leaves no teacher term"):
        AlgorithmConfig(name="opd", opd_scale=0.0)


def test_opd_advantage_clip_bounds_the_divergence_token():
    # The oracle's divergence token: teacher log(ε/V) ≈ -13.8 against behaviour -0.1.
    logp = torch.tensor([[-0.1, -2.0]], requires_grad=True)
    b = batch([[-0.1, -2.0]], teacher=[[-13.8, -0.05]])
    out = ALGORITHMS["opd"].loss(logp, b, AlgorithmConfig(name="opd", opd_advantage_clip=3.0))
    out.loss_sum.backward()
    assert logp.grad[0].tolist() == pytest.approx([3.0, -1.95])  # -13.7 bounded to -3; 1.95 untouched
    unbounded = ALGORITHMS["opd"].loss(logp.detach(), b, AlgorithmConfig(name="opd", opd_advantage_clip=None))
    by_default = ALGORITHMS["opd"].loss(logp.detach(), b, AlgorithmConfig(name="opd"))
    assert by_default.loss_sum.item() == pytest.approx(5.0 - 1.95)  # bounded at 5 nats unless configured
    assert unbounded.loss_sum.item() == pytest.approx(13.7 - 1.95)
    # reverse KL is still the unbounded estimate (a diagnostic, not the loss).
    assert out.stats["reverse_kl"] == unbounded.stats["reverse_kl"]


def test_joint_is_grpo_plus_lambda_opd():
    logp = torch.tensor([[-1.0, -1.0]])
    b = batch([[-1.0, -1.0]], adv=[[1.0, 1.0]], teacher=[[0.0, 0.0]])
    g = ALGORITHMS["grpo"].loss(logp, b, AlgorithmConfig(name="grpo")).loss_sum.item()
    o = ALGORITHMS["opd"].loss(logp, b, AlgorithmConfig(name="opd")).loss_sum.item()
    j = ALGORITHMS["joint"].loss(logp, b, JointConfig(name="joint", opd_lambda=0.25)).loss_sum.item()
    assert j == pytest.approx(g + 0.25 * o)
    retired = ALGORITHMS["joint"].loss(logp, batch([[-1.0, -1.0]], adv=[[1.0, 1.0]]), JointConfig(name="joint", opd_lambda=0))
    assert retired.loss_sum.item() == pytest.approx(g)  # λ = 0 needs no teacher


def test_opd_with_the_format_reward_adds_the_turn_format_term_to_the_advantage():
    """Document 000 v3.1.2: OPD + format reward. Teacher and behaviour agree (OPD advantage 0), so
    the loss is the format term alone: -coef · r_format per token at ratio 1."""
    logp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    b = batch([[-1.0, -1.0]], teacher=[[-1.0, -1.0]], turn_rewards=[[-0.5, -0.5]])
    assert ALGORITHMS["opd"].loss(logp, b, AlgorithmConfig(name="opd")).loss_sum.item() == pytest.approx(0.0)
    out = ALGORITHMS["opd"].loss(logp, b, AlgorithmConfig(name="opd", opd_format_coef=2.0))
    assert out.loss_sum.item() == pytest.approx(2.0)  # -(2 · -0.5) = 1 on each of the 2 tokens


def test_turn_level_uses_turn_rewards():
    out = ALGORITHMS["turn_level"].loss(torch.tensor([[-1.0, -1.0]]), batch([[-1.0, -1.0]], turn_rewards=[[0.5, -1.0]]),
                               TurnLevelConfig(name="turn_level"))
    assert out.loss_sum.item() == pytest.approx(0.5)


def traj(tid, outcome, n=3):
    turns = tuple(Turn(k, (1,), (2,), (-0.1,), 0) for k in range(n))
    return Trajectory(tid, "g", "train", 0, "go_to", turns, outcome > 0, outcome, 0.5)


def run_stages(name: str, trajectories, score=None, **knobs):
    cfg = parse_algorithm_config({"name": name, **knobs})
    ctx = StageContext(worker_index=0, score=score)
    out = trajectories
    for factory in ALGORITHMS[name].group_stages(cfg):
        out = asyncio.run(factory(cfg, ctx)(out))
    return out


def test_group_advantages_and_zero_variance_groups():
    out = group_advantages([traj("a", 1.0), traj("b", -1.0), traj("c", -1.0), traj("d", 1.0)], drop_flat=True)
    assert [t.advantage for t in out] == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    assert run_stages("grpo", [traj("a", 1.0), traj("b", 1.0)]) == []
    assert len(run_stages("grpo", [traj("a", 1.0), traj("b", 1.0)], drop_zero_variance_groups=False)) == 2

    async def score(trajectories):
        return [dataclasses.replace(t, group_id="scored") for t in trajectories]

    kept = run_stages("opd", [traj("a", 1.0), traj("b", 1.0)], score=score)
    assert [t.advantage for t in kept] == [0.0, 0.0] and {t.group_id for t in kept} == {"scored"}
    assert [t.group_id for t in run_stages("grpo", [traj("a", 1.0), traj("b", -1.0)])] == ["g", "g"]
    # The top-k term needs the teacher under any algorithm; without one the stage says so.
    assert {t.group_id for t in run_stages("grpo", [traj("a", 1.0), traj("b", -1.0)], score=score,
                                           topk_kl_coef=1.0)} == {"scored"}
    with pytest.raises(ValueError, match="needs a teacher"):
        run_stages("opd", [traj("a", 1.0)])


def test_grpo_window_scores_each_episode_against_the_episodes_of_its_kind_that_ended_before_it():
    """grpo_window: GRPO's formula over the episode and the window - 1 episodes with its key that
    ended before it (here window 3, format term 0.5 on each), per task type unless `all`."""
    cfg = parse_algorithm_config({"name": "grpo_window", "window": 3})
    stage = ALGORITHMS["grpo_window"].group_stages(cfg)[0](cfg, StageContext(worker_index=0))

    def typed(tid, outcome, task_type="go_to"):
        return dataclasses.replace(traj(tid, outcome), task_type=task_type)

    def advantages(*episodes):
        return [[t.advantage for t in asyncio.run(stage([e]))] for e in episodes]

    # The first episode of a kind has no group (dropped: its advantage would be 0), nor has an
    # episode whose group's rewards all agree.
    assert advantages(typed("a", -1.0), typed("b", -1.0)) == [[], []]
    # Group [-0.5, -0.5, 1.5]: mean 1/6, std 0.943; the success stands out, then the window moves.
    (c,), (d,) = advantages(typed("c", 1.0), typed("d", -1.0))
    assert c == pytest.approx((1.5 - 1 / 6) / math.sqrt(8 / 9), abs=1e-5)
    assert d == pytest.approx((-0.5 - 1 / 6) / math.sqrt(8 / 9), abs=1e-5)  # its group [-0.5, 1.5, -0.5]
    # Another task type starts a group of its own ...
    assert advantages(typed("e", 1.0, "pick_up")) == [[]]
    # ... unless every episode shares one; and the flat filter is GRPO's knob.
    shared = parse_algorithm_config({"name": "grpo_window", "window": 2, "window_key": "all",
                                     "drop_zero_variance_groups": False})
    shared_stage = ALGORITHMS["grpo_window"].group_stages(shared)[0](shared, StageContext(worker_index=0))
    out = [asyncio.run(shared_stage([e]))[0].advantage
           for e in (typed("f", -1.0), typed("g", 1.0, "pick_up"), typed("h", 1.0))]
    assert out == pytest.approx([0.0, 1.0, 0.0], abs=1e-5)
    # A streak of flat episodes counts toward run.max_groups_without_signal in windows of them.
    assert ALGORITHMS["grpo_window"].flat_streak_scale(cfg) == 3 and ALGORITHMS["grpo"].flat_streak_scale(cfg) == 1


def test_turn_level_without_a_judge_trains_each_selected_turn_on_outcome_plus_its_format_term():
    """Document 000 v2.3 (turn-level, no judge): r = outcome + the turn's format term. Strict
    format puts the episode's -0.5 on every turn (envs/rewards.py), so a failed episode with a
    malformed turn gives each of its trained turns the -1.5 the document reports."""
    from envs.rewards import RewardConfig, episode_reward

    reward = episode_reward(RewardConfig(), success=False, turn_well_formed=[True, False, True, True, True, True])
    t = traj("a", reward.outcome, n=6)
    t = dataclasses.replace(t, turns=tuple(dataclasses.replace(turn, turn_reward=r)
                                           for turn, r in zip(t.turns, reward.per_turn)))
    (out,) = run_stages("turn_level", [t], turn_level_k=4)
    trained = [turn.turn_reward for turn in out.turns if turn.trainable]
    assert trained == [-1.5] * 4
    assert [turn.turn_reward for turn in out.turns if not turn.trainable] == [-0.5, -0.5]


@pytest.mark.parametrize("name", ["joint", "retire_opd"])
def test_an_all_fail_group_keeps_its_opd_term_under_the_joint_loss(name):
    """A group whose episodes all failed carries no GRPO signal; GRPO alone drops it, but under
    L_GRPO + λ L_OPD it is scored by the teacher and trained on the OPD term alone (advantage 0)."""
    async def score(trajectories):
        return [dataclasses.replace(t, group_id="scored") for t in trajectories]

    kept = run_stages(name, [traj("a", -1.0), traj("b", -1.0), traj("c", -1.0)], score=score)
    assert [t.advantage for t in kept] == [0.0, 0.0, 0.0] and {t.group_id for t in kept} == {"scored"}
    cfg = parse_algorithm_config({"name": name, "opd_lambda": 0.5})
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    b = batch([[-1.0, -2.0]], teacher=[[-0.5, -1.0]], adv=[[0.0, 0.0]])
    joint = ALGORITHMS[name].loss(logp, b, cfg).loss_sum
    opd = ALGORITHMS["opd"].loss(logp, b, AlgorithmConfig(name="opd")).loss_sum
    assert joint.item() == pytest.approx(0.5 * opd.item()) and joint.item() != 0.0


def test_select_turns_is_deterministic():
    t = traj("x", 1.0, n=10)
    a, b = select_turns(t, 4, seed=0), select_turns(t, 4, seed=0)
    assert a == b and sum(turn.trainable for turn in a.turns) == 4
    assert select_turns(traj("y", 1.0, n=3), 4, seed=0).turns == traj("y", 1.0, n=3).turns


def test_forward_kl_topk_against_hand_computed_values():
    from learner.algorithms import forward_kl_topk

    b = batch([[0.0, 0.0, 0.0]], mask=[[False, True, True]])
    # Position 1: two candidates with teacher probs 0.6 / 0.2 (renormalised 0.75 / 0.25); position 2:
    # one candidate (q = 1) and a pad; position 0 is masked out.
    b.teacher_topk_ids = torch.tensor([[[-1, -1], [4, 7], [5, -1]]])
    b.teacher_topk_logprobs = torch.tensor([[[0.0, 0.0], [math.log(0.6), math.log(0.2)], [math.log(0.9), 0.0]]])
    student = torch.tensor([[[9.0, 9.0], [math.log(0.5), math.log(0.1)], [math.log(0.4), 9.0]]], requires_grad=True)
    out = forward_kl_topk(student, b, AlgorithmConfig(topk_kl_coef=1.0))
    kl1 = 0.75 * (math.log(0.75) - math.log(0.5)) + 0.25 * (math.log(0.25) - math.log(0.1))
    kl2 = 1.0 * (0.0 - math.log(0.4))
    assert out.num_units == 2 and out.loss_sum.item() == pytest.approx(kl1 + kl2, abs=1e-5)
    out.loss_sum.backward()
    # d/d log π(v) = -q(v): the teacher's preferred tokens are raised in proportion to q; pads and
    # masked positions get nothing.
    expected = torch.tensor([[[0.0, 0.0], [-0.75, -0.25], [-1.0, 0.0]]])
    assert torch.allclose(student.grad, expected, atol=1e-6)
    with pytest.raises(ValueError, match="teacher.top_k"):
        forward_kl_topk(student, batch([[0.0]]), AlgorithmConfig())
