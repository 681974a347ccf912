"""An environment and an algorithm registered from this file alone run through the agent loop,
the group-end stages and a learner step: the seams a new environment or algorithm plugs into."""

import asyncio
import dataclasses
import os
from typing import Any, Literal

import pytest
import torch
import torch.distributed as dist

from actors.agent_loop import EpisodeTask, LoopConfig, run_episodes
from actors.expert import DemonstrationPolicy
from buffer.expansion import expand, to_sequences
from envs.protocol import EnvReset, EnvStep, TaskInfo, ToolCall
from envs.registry import EnvConfig, make_env, register_env
from envs.tools import function_tool
from jobs.config import ConfigError, load_config
from learner.algorithms import (ALGORITHMS, Algorithm, AlgorithmConfig, LossOutput, StageContext, _aggregate,
                                opd_lambda, register_algorithm)
from cluster.local import free_port
from models.loading import ModelConfig, load_tokenizer
from learner.trainer import LearnerConfig, Trainer

NANO = ModelConfig(path="tiny:nano")


class LampConfig(EnvConfig):
    name: Literal["lamp_test"] = "lamp_test"
    num_lamps: int = 2


class LampEnv:
    """Switch on the lamp the task names; one call ends the episode."""

    system_prompt = "You control lamps. Call exactly one tool."
    splits = ("train",)
    task_types = ("switch",)

    def __init__(self, config: LampConfig) -> None:
        self.config = config
        self.target = 0

    @property
    def tools(self) -> list[dict[str, Any]]:
        return [function_tool(f"lamp_{i}", f"Switch on lamp {i}.") for i in range(self.config.num_lamps)]

    def split_size(self, split: str) -> int | None:
        return None

    def reset(self, seed: int, split: str) -> EnvReset:
        self.target = seed % self.config.num_lamps
        info = TaskInfo(split, seed, "switch", max_steps=1)
        return EnvReset(f"switch on lamp {self.target}", "All lamps are off.", info)

    def step(self, call: ToolCall) -> EnvStep:
        success = call.name == f"lamp_{self.target}"
        return EnvStep("The lamp is on." if success else "Wrong lamp.", done=True, success=success, num_steps=1)

    def expert(self):
        env = self

        class Expert:
            def act(self, executed):
                return ToolCall(f"lamp_{env.target}")

        return Expert()


register_env("lamp_test", LampConfig, LampEnv)


async def _reward_as_advantage(trajectories):
    return [dataclasses.replace(t, advantage=t.outcome_reward) for t in trajectories]


def reward_advantages(cfg: AlgorithmConfig, ctx: StageContext):
    return _reward_as_advantage


def reinforce_loss(logprobs: torch.Tensor, batch, cfg: AlgorithmConfig) -> LossOutput:
    loss, units = _aggregate(-batch.advantages * logprobs, batch.loss_mask, cfg.aggregation)
    return LossOutput(loss, units, {})


register_algorithm("reinforce_test", Algorithm(reinforce_loss, (reward_advantages,),
                                                gauges=(opd_lambda(lambda cfg, step: 0.0),)))


@pytest.fixture(scope="module", autouse=True)
def process_group():
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_job_config_names_the_registered_env_and_algorithm(tmp_path):
    from jobs.train import JobConfig

    config = load_config(JobConfig, None, ["env.name=lamp_test", "env.num_lamps=3", "teacher=null",
                                           "learner.algorithm.name=reinforce_test"])
    assert isinstance(config.env, LampConfig) and config.env.num_lamps == 3
    assert isinstance(make_env(config.env), LampEnv)
    assert not ALGORITHMS["reinforce_test"].uses_teacher(config.learner.algorithm)
    with pytest.raises(ConfigError, match="env.num_bulbs"):
        load_config(JobConfig, None, ["env.name=lamp_test", "env.num_bulbs=3"])
    with pytest.raises(ConfigError, match=r"unknown environment 'nope'.*'lamp_test'"):
        load_config(JobConfig, None, ["env.name=nope"])
    with pytest.raises(ConfigError, match=r"unknown algorithm 'nope'.*'reinforce_test'"):
        load_config(JobConfig, None, ["learner.algorithm.name=nope"])


def test_the_plugged_in_env_and_algorithm_train_end_to_end():
    env_config = LampConfig(num_lamps=2)
    algorithm = AlgorithmConfig(name="reinforce_test")
    tok = load_tokenizer(NANO)
    loop = LoopConfig(max_turns=2)
    # The agent loop with the env's own expert, in the student's token format.
    results = run_episodes(lambda: make_env(env_config), [EpisodeTask("train", s) for s in range(4)],
                           DemonstrationPolicy(tok, loop), loop)
    assert all(r.success and r.num_turns == 1 for r in results)
    # The algorithm's group-end stages, as a rollout worker runs them.
    trajectories = [r.trajectory for r in results]
    for factory in ALGORITHMS["reinforce_test"].group_stages(algorithm):
        trajectories = asyncio.run(factory(algorithm, StageContext(worker_index=0))(trajectories))
    assert [t.advantage for t in trajectories] == [t.outcome_reward for t in trajectories]
    assert all(t.advantage > 0 for t in trajectories)
    # One learner step with the algorithm's loss raises the rewarded responses' log-probs.
    trainer = Trainer(LearnerConfig(algorithm=algorithm, lr=1e-2), NANO)
    sequences = to_sequences([s for t in trajectories for s in expand(t)])

    def mean_logprob() -> float:
        logprobs = trainer.evaluate_logprobs(sequences)
        return sum(lp[torch.tensor(s.loss_mask)].mean().item() for s, lp in zip(sequences, logprobs)) / len(sequences)

    before = mean_logprob()
    stats = trainer.train_step(sequences)
    assert stats["version"] == 1 and stats["loss"] == pytest.approx(-before * trajectories[0].advantage, rel=0.05)
    assert mean_logprob() > before
