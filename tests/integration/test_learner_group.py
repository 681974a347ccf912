"""Learner ranks as Ray actors: 2 ranks match 1 rank, publish to rollout, checkpoint resume (2 ranks
into 1 too), a hung rank."""

import os
import signal

import pytest

from models.weights import weights_as_tensors
from buffer.actor import BufferConfig, create_buffer_actor, encode_trajectories
from buffer.contracts import Trajectory, Turn
from learner.algorithms import AlgorithmConfig, JointConfig
from learner.group import LearnerGroup, LearnerHung
from models.loading import ModelConfig
from learner.trainer import LearnerConfig

NANO = ModelConfig(path="tiny:nano")


def fake_trajectories():
    """Deterministic episodes with nested prompts (packable), advantages of both signs."""
    out = []
    for i in range(6):
        prompt, turns = (1, 5 + i, 7, 9), []
        for k in range(3):
            response = (20 + i, 30 + k, 2)
            turns.append(Turn(k, prompt, response, (-3.0, -2.5, -1.0), 0, teacher_logprobs=(-1.0, -2.0, -0.5)))
            prompt = prompt + response + (40 + k, 41)
        out.append(Trajectory(f"t{i}", f"g{i // 2}", "train", i, "go_to", tuple(turns), i % 2 == 0,
                              1.0 if i % 2 == 0 else -1.0, 0.5, advantage=1.0 if i % 2 == 0 else -1.0))
    return out


def batch_of(ray, trajectories):
    """A batch by reference, and the buffer that owns its bytes (keep it alive while reading)."""
    buffer = create_buffer_actor(BufferConfig())
    ray.get(buffer.put.remote(encode_trajectories(trajectories)))
    return ray.get(buffer.get.remote(10_000, learner_version=0, timeout_s=1)), buffer


def test_two_ranks_match_one_rank_and_resume(ray_session, tmp_path):
    import ray

    cfg = LearnerConfig(algorithm=JointConfig(name="joint", opd_lambda=0.5), lr=2e-3)
    batch, _owner = batch_of(ray, fake_trajectories())
    one = LearnerGroup(1, cfg, NANO, num_cpus=0.5)
    two = LearnerGroup(2, cfg, NANO, num_cpus=0.5)
    s1, s2 = one.train(batch), two.train(batch)
    assert s1["num_sequences"] == s2["num_sequences"] == 6  # each episode packed into one sequence
    assert s1["loss"] == pytest.approx(s2["loss"], abs=1e-5)
    assert s1["grad_norm"] == pytest.approx(s2["grad_norm"], rel=1e-4)
    w1, w2 = (weights_as_tensors(ray.get(group.publish())) for group in (one, two))
    assert set(w1) == set(w2) and max(float((w1[k] - w2[k]).abs().max()) for k in w1) < 1e-5
    assert two.version() == 1

    path = two.save(str(tmp_path / "ckpt"), extra={"retired": True})
    expected = two.train(batch)["loss"]
    for group in (one, two):  # free their CPUs: the resumed group needs them
        for r in group.ranks:
            ray.kill(r)
    # The sharded checkpoint into one rank, which does not shard (a lone fp32 rank): DCP reshards.
    alone = LearnerGroup(1, cfg, NANO, num_cpus=0.5)
    assert alone.load(path) == {"retired": True} and alone.version() == 1
    assert alone.train(batch)["loss"] == pytest.approx(expected, abs=1e-6)
    for r in alone.ranks:
        ray.kill(r)
    resumed = LearnerGroup(2, cfg, NANO, num_cpus=0.5)
    assert resumed.load(path) == {"retired": True} and resumed.version() == 1
    assert resumed.train(batch)["loss"] == pytest.approx(expected, abs=1e-6)
    # Rank 1 hangs (alive, not answering): rank 0 waits in the step's collectives, and the
    # group names rank 1 within learner.call_timeout_s instead of waiting forever.
    resumed.call_timeout_s = 5.0  # learner.call_timeout_s, short here (a loaded machine must not trip it before)
    os.kill(ray.get(resumed.ranks[1].__ray_call__.remote(lambda self: os.getpid())), signal.SIGSTOP)
    with pytest.raises(LearnerHung, match=r"learner rank\(s\) \[0, 1\] did not answer `train` within 5 s"):
        resumed.train(batch)
    for r in resumed.ranks:
        ray.kill(r)


def test_published_weights_reach_rollout_workers(ray_session):
    import ray

    from actors.agent_loop import LoopConfig
    from actors.engine import SamplingConfig
    from actors.pool import RolloutPool
    from actors.rollout_worker import RolloutConfig

    learner = LearnerGroup(1, LearnerConfig(algorithm=AlgorithmConfig(name="grpo"), lr=5e-3), NANO, num_cpus=0.5)
    batch, _owner = batch_of(ray, fake_trajectories())
    learner.train(batch)
    buffer = create_buffer_actor(BufferConfig())
    pool = RolloutPool(1, RolloutConfig(engine="hf", num_envs=2, group_size=2,
                                        sampling=SamplingConfig(max_new_tokens=8, seed=0),
                                        loop=LoopConfig(max_turns=2)), NANO, buffer, num_cpus=0.5)
    pool.publish_weights(learner.publish(), version=learner.version())
    pool.start(max_groups_per_worker=1)
    pool.wait(timeout_s=120)
    got = ray.get(buffer.get.remote(100, learner_version=1, timeout_s=1))
    assert got.num_samples > 0 and {v for vs in got.policy_versions for v in vs} == {1}
    # The worker's behaviour log-probs are the learner's own on the same tokens.
    from buffer.actor import fetch_samples
    from buffer.contracts import table_to_samples

    samples = table_to_samples(fetch_samples(got))
    learner_lp = learner.logprobs(got)
    for s, lp in zip(samples, learner_lp):
        mine = lp[len(s.prompt_ids):]
        assert max(abs(a - b) for a, b in zip(mine, s.behaviour_logprobs)) < 1e-4
    for r in learner.ranks:
        ray.kill(r)
