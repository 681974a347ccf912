"""A teacher backend and a judge backend registered from this file alone: a job config names
them, preflight checks them, and the services the job starts (`create_teacher_service`,
`create_judge_service`, in Ray actors) score with them, fed by real rollout workers."""

import sys

import pytest

from actors.agent_loop import EpisodeTask, LoopConfig, run_episodes
from actors.expert import DemonstrationPolicy
from actors.pool import RolloutPool
from buffer.actor import BufferConfig, create_buffer_actor
from envs.babyai_text import BabyAITextConfig
from envs.registry import make_env
from judge.registry import JudgeBackendEntry, register_judge_backend
from judge.service import JudgeConfig, create_judge_service
from learner.algorithms import AlgorithmConfig
from models.loading import load_tokenizer
from teacher.backends import TokenScores
from teacher.registry import TeacherBackendEntry, register_teacher_backend
from teacher.service import TeacherConfig, create_teacher_service
from test_rollout import NANO, drain, rollout_config

CONSTANT = -1.25
"""The log-prob the test teacher gives every token."""


class ConstantScorer:
    def score_trajectories(self, trajectories, top_k=0):
        return [[TokenScores((CONSTANT,) * len(turn.response_ids)) for turn in t.turns] for t in trajectories]


class LastTurnJudge:
    """Scores 1 for an episode's last turn, 0 for the others."""

    async def check(self):
        pass

    async def score(self, trajectory, turn):
        return float(turn == len(trajectory.turns) - 1)

    async def close(self):
        pass


register_teacher_backend("constant_test", TeacherBackendEntry(lambda config, ctx: ConstantScorer()))
register_judge_backend("last_turn_test", JudgeBackendEntry(lambda config, model, env: LastTurnJudge()))


def test_a_job_config_names_the_registered_backends_and_preflight_checks_them():
    from jobs.config import ConfigError, load_config
    from jobs.train import JobConfig, preflight

    config = load_config(JobConfig, None, ["teacher.backend=constant_test", "judge.backend=last_turn_test",
                                           "learner.algorithm.name=turn_judge", "teacher=null", "run.metrics_port=null"])
    assert config.judge.backend == "last_turn_test"
    config = load_config(JobConfig, None, ["teacher.backend=constant_test", "run.metrics_port=null"])
    assert config.teacher.backend == "constant_test"
    preflight(config)
    with pytest.raises(ConfigError, match=r"unknown teacher backend 'nope'.*'constant_test'"):
        load_config(JobConfig, None, ["teacher.backend=nope"])
    with pytest.raises(ConfigError, match=r"unknown judge backend 'nope'.*'last_turn_test'"):
        load_config(JobConfig, None, ["judge.backend=nope"])
    with pytest.raises(ConfigError, match="the last_turn_test backend cannot judge through one"):
        load_config(JobConfig, None, ["judge.backend=last_turn_test", "judge.serve.model.path=tiny:nano"])


def test_the_services_a_job_starts_score_with_the_registered_backends(ray_session):
    import ray
    from ray import cloudpickle

    # The entries travel to the actors by value, as a user's own module's would.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    env = BabyAITextConfig()
    buffer = create_buffer_actor(BufferConfig(capacity_samples=10_000, batch_size=64))
    teacher = create_teacher_service(TeacherConfig(backend="constant_test", batch_window_s=0.05), NANO, env,
                                     num_cpus=0)
    pool = RolloutPool(1, rollout_config(), NANO, buffer, [teacher], num_cpus=0.5,
                       algorithm=AlgorithmConfig(name="opd"))
    pool.start(max_groups_per_worker=2)
    pool.wait(timeout_s=300)
    samples = drain(ray, buffer)
    assert len({s.group_id for s in samples}) == 2
    assert all(s.teacher_logprobs is not None and set(s.teacher_logprobs) == {CONSTANT} for s in samples)

    judge_config = JudgeConfig(backend="last_turn_test", outcome_weight=0.0, judge_weight=1.0)
    judge = create_judge_service(judge_config, NANO, env, num_cpus=0)
    loop = LoopConfig(max_turns=4)
    results = run_episodes(lambda: make_env(env), [EpisodeTask("train", seed) for seed in range(2)],
                           DemonstrationPolicy(load_tokenizer(NANO), loop), loop)
    played = [r.trajectory for r in results]
    judged = ray.get(judge.judge.remote(played))
    for before, after in zip(played, judged):
        last = len(before.turns) - 1
        # judge_weight · (2s − 1) on top of each turn's own format term
        terms = [a.turn_reward - b.turn_reward for b, a in zip(before.turns, after.turns)]
        assert terms == pytest.approx([1.0 if k == last else -1.0 for k in range(last + 1)]), terms
    assert ray.get(judge.stats.remote())["num_turns_judged"] == sum(len(t.turns) for t in judged)
