"""Episodes/s through the agent gateway against the built-in agent loop, on the same engine.

One vLLM engine (the tiny default's rollout section, in this process) plays the same tasks three
ways: the built-in loop (`run_episodes`), the gateway with the example agent as a command (one
Python process per episode, as `jobs/configs/babyai_gateway_tiny.yaml` runs it), and the gateway
with the same agent as a callable (a thread of the worker: no process start). K episodes run at
once in every arm. The student is untrained, so most episodes run all their turns; turns/s is
reported beside episodes/s because sampled episodes differ in length between arms. Goal:
gateway_over_inprocess >= 0.8 (the command, the way the example config runs).

    python benchmarks/gateway_overhead.py [--episodes 64] [--envs 16] [--turns 10]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="jobs/configs/babyai_gateway_tiny.yaml")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch

    from actors.agent_loop import AGENT_FAILED, EpisodeTask, ModelPolicy, run_episodes
    from actors.gateway import GatewayRunner
    from actors.rollout_worker import build_engine
    from envs.registry import make_env
    from jobs.config import load_config
    from jobs.train import JobConfig
    from models.loading import load_tokenizer

    torch.set_num_threads(args.threads)
    job = load_config(JobConfig, args.config)
    loop = job.rollout.loop.model_copy(update={"max_turns": args.turns})
    tokenizer = load_tokenizer(job.model)
    engine = build_engine(job.rollout.model_copy(update={"num_threads": args.threads}), job.model, tokenizer)
    policy = ModelPolicy(engine, tokenizer, job.rollout.sampling, loop)
    arms = {"inprocess": (job.env.tasks, None),
            "gateway_command": (job.env, GatewayRunner),
            "gateway_callable": (job.env.model_copy(update={"command": None, "callable": "examples.gateway_agent:run"}),
                                 GatewayRunner)}

    def play(env, runner, seeds) -> tuple[float, float, int]:
        tasks = [EpisodeTask("train", s) for s in seeds]
        start = time.perf_counter()
        results = run_episodes(lambda: make_env(env), tasks, policy, loop, batch_size=args.envs, runner=runner)
        elapsed = time.perf_counter() - start
        assert len(results) == len(tasks)
        failed = sum(r.truncated == AGENT_FAILED for r in results)
        return len(results) / elapsed, sum(r.num_turns for r in results) / elapsed, failed

    measured = {}
    for name, (env, runner) in arms.items():
        play(env, runner, range(1000, 1000 + args.envs))  # warm: engine graphs, imports, page cache
        measured[name] = play(env, runner, range(args.episodes))
        eps, tps, failed = measured[name]
        print(f"{name:18s} {eps:6.2f} episodes/s  {tps:7.1f} turns/s  failed sessions {failed}", flush=True)
    base_eps, base_tps, _ = measured["inprocess"]
    command, callable_ = measured["gateway_command"], measured["gateway_callable"]
    print(f"RESULT gateway_over_inprocess={command[0] / base_eps:.2f} "
          f"gateway_turns_over_inprocess={command[1] / base_tps:.2f} "
          f"callable_over_inprocess={callable_[0] / base_eps:.2f} "
          f"callable_turns_over_inprocess={callable_[1] / base_tps:.2f} "
          f"inprocess_episodes_per_s={base_eps:.2f} failed_sessions={command[2] + callable_[2]} "
          f"episodes={args.episodes} envs={args.envs}")


if __name__ == "__main__":
    main()
