"""Environments in their own actors: same episodes as in-process, and a killed one is restarted
with its episode started over, exactly once in the results."""

import os
import signal

import pytest

from actors.agent_loop import EpisodeRunner, EpisodeTask, LoopConfig, run_episodes
from actors.env_actor import RemoteEnv
from actors.expert import ExpertPolicy
from envs.registry import default_env_config, make_env


def test_env_actors_play_the_same_episodes_as_in_process(ray_session):
    config = default_env_config()
    tasks = [EpisodeTask("train", s) for s in range(6)]
    local = run_episodes(lambda: make_env(config), tasks, ExpertPolicy(), LoopConfig(max_turns=64), batch_size=3)
    envs = iter([RemoteEnv(config) for _ in range(3)])
    remote = run_episodes(lambda: next(envs), tasks, ExpertPolicy(), LoopConfig(max_turns=64), batch_size=3)
    assert [(r.task, r.success, r.num_turns, r.info) for r in remote] == \
        [(r.task, r.success, r.num_turns, r.info) for r in local]


class KillingExpert(ExpertPolicy):
    """The expert, which sends one environment actor's process a signal once, mid-episode (after
    answering: a model policy never calls its environments while it generates): SIGKILL, or
    SIGSTOP to leave it alive but hung."""

    def __init__(self, victim: RemoteEnv, at_round: int, signum: int = signal.SIGKILL):
        self.victim, self.at_round, self.round, self.signum = victim, at_round, 0, signum

    def respond(self, episodes):
        responses = super().respond(episodes)
        self.round += 1
        if self.round == self.at_round:  # while "generating": before the round's environment steps
            os.kill(self.victim.pid(), self.signum)
        return responses


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
def test_a_killed_or_hung_env_actor_is_restarted_and_its_episode_rerun_once(ray_session, signum):
    config = default_env_config()
    envs = [RemoteEnv(config, max_restarts=2, call_timeout_s=10.0) for _ in range(2)]
    first_pid = envs[0].pid()
    runner = EpisodeRunner(iter(envs).__next__, 2, LoopConfig(max_turns=64))
    policy = KillingExpert(envs[0], at_round=3, signum=signum)
    pending = [EpisodeTask("train", s) for s in range(4)][::-1]
    results = []
    while pending or runner.num_active:
        runner.start_many([(pending.pop(), None) for _ in range(min(len(pending), runner.num_free))])
        results.extend(result for _, result in runner.step(policy))
    assert runner.num_env_restarts == 1 and envs[0].pid() != first_pid
    assert sorted(r.task.seed for r in results) == [0, 1, 2, 3]  # every task once: none lost, none twice
    assert all(r.success for r in results)  # the re-run episode played from its reset
