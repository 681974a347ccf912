"""Episodes/s through the agent gateway against the built-in agent loop, on the same engine.

One vLLM engine (the tiny default's rollout section, in this process) plays the same tasks five
ways: the built-in loop (`run_episodes`); the gateway with the example agent as a persistent
command (one Python process per slot reading sessions on stdin, as
`jobs/configs/babyai_gateway_tiny.yaml` runs it); the same without continuous batching (calls
answered in rounds of `generate`, what the gateway did before `VLLMEngine.stream`); as a command
per session (a Python process started per episode); and as a callable (a thread of the worker).
K episodes run at once in every arm. The student is untrained, so most episodes run all their
turns; turns/s is reported beside episodes/s because sampled episodes differ in length between
arms. Goal: gateway_over_inprocess >= 0.8 (the persistent command, the example config's way).

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
    parser.add_argument("--batch-window-s", type=float, help="env.batch_window_s (default: the config's)")
    args = parser.parse_args()

    import torch

    from actors.agent_loop import AGENT_FAILED, EpisodeRunner, EpisodeTask, ModelPolicy, play_episodes
    from actors.gateway import GatewayRunner
    from actors.rollout_worker import build_engine
    from envs.registry import make_env
    from jobs.config import load_config
    from jobs.train import JobConfig
    from models.loading import load_tokenizer

    torch.set_num_threads(args.threads)
    overrides = [] if args.batch_window_s is None else [f"env.batch_window_s={args.batch_window_s}"]
    job = load_config(JobConfig, args.config, overrides)
    loop = job.rollout.loop.model_copy(update={"max_turns": args.turns})
    tokenizer = load_tokenizer(job.model)
    engine = build_engine(job.rollout.model_copy(update={"num_threads": args.threads}), job.model, tokenizer)
    batches: list[int] = []  # requests per engine call, or per admission into the running batch
    generate, stream = engine.generate, engine.stream

    def counted(prompts, sampling):
        batches.append(len(prompts))
        return generate(prompts, sampling)

    def counted_stream(admit):
        def counted_admit():
            requests = admit()
            if requests:
                batches.append(len(requests))
            return requests
        return stream(counted_admit)

    class Rounds:
        """The engine without continuous batching: the gateway answers in rounds of `generate`."""
        version = property(lambda self: engine.version)
        generate = staticmethod(counted)

    engine.generate, engine.stream = counted, counted_stream
    policy = ModelPolicy(engine, tokenizer, job.rollout.sampling, loop)
    rounds_policy = ModelPolicy(Rounds(), tokenizer, job.rollout.sampling, loop)
    persistent = job.env.model_copy(update={"persistent": True})
    arms = {"inprocess": (job.env.tasks, None, policy),
            "gateway_persistent": (persistent, GatewayRunner, policy),
            "gateway_rounds": (persistent, GatewayRunner, rounds_policy),
            "gateway_per_session": (job.env.model_copy(update={"persistent": False}), GatewayRunner, policy),
            "gateway_callable": (job.env.model_copy(update={"command": None, "persistent": False,
                                                            "callable": "examples.gateway_agent:run"}),
                                 GatewayRunner, policy)}

    def play(runner, seeds, arm_policy) -> tuple[float, float, int]:
        tasks = [EpisodeTask("train", s) for s in seeds]
        batches.clear()
        start = time.perf_counter()
        results = play_episodes(runner, tasks, arm_policy)
        elapsed = time.perf_counter() - start
        assert len(results) == len(tasks)
        failed = sum(r.truncated == AGENT_FAILED for r in results)
        return len(results) / elapsed, sum(r.num_turns for r in results) / elapsed, failed

    measured = {}
    for name, (env, runner_cls, arm_policy) in arms.items():
        # One runner per arm, as a worker keeps one for its run: the warm-up starts the persistent
        # programs, compiles the engine's graphs and fills the page cache.
        runner = (runner_cls or EpisodeRunner)(lambda: make_env(env), args.envs, loop)
        try:
            play(runner, range(1000, 1000 + args.envs), arm_policy)
            measured[name] = play(runner, range(args.episodes), arm_policy)
        finally:
            runner.close()
        eps, tps, failed = measured[name]
        print(f"{name:19s} {eps:5.2f} episodes/s {tps:6.1f} turns/s  {len(batches)} engine calls or admissions of "
              f"{sum(batches) / len(batches):.1f} requests  failed sessions {failed}", flush=True)
    base_eps, base_tps, _ = measured["inprocess"]
    persistent, rounds, per_session, callable_ = (measured[k] for k in (
        "gateway_persistent", "gateway_rounds", "gateway_per_session", "gateway_callable"))
    print(f"RESULT gateway_over_inprocess={persistent[0] / base_eps:.2f} "
          f"gateway_turns_over_inprocess={persistent[1] / base_tps:.2f} "
          f"rounds_over_inprocess={rounds[0] / base_eps:.2f} "
          f"per_session_over_inprocess={per_session[0] / base_eps:.2f} "
          f"callable_over_inprocess={callable_[0] / base_eps:.2f} "
          f"inprocess_episodes_per_s={base_eps:.2f} "
          f"failed_sessions={persistent[2] + rounds[2] + per_session[2] + callable_[2]} "
          f"episodes={args.episodes} envs={args.envs}")


if __name__ == "__main__":
    main()
