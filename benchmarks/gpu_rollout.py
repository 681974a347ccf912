"""Rollout decode and teacher scoring throughput of the HF engine at real Qwen3 shapes (no Ray,
no weights): the engine the GPU path falls back to where vLLM is not installed.

Decode: `--envs` episodes generated as one batch for `--turns` turns; each turn appends the
response and an observation of `--obs-tokens` tokens to the episode's prompt, as the agent
loop does. Measured twice in the same run on the same model: with KV reuse (the engine's
default: a turn prefills only what it added) and with it off (the whole history re-prefilled
every turn: the baseline). Responses run to `--response-tokens` (the stop id is one a random
model almost never samples), so both arms generate the same number of tokens.

Scoring: the teacher backend (teacher.backends.HFTeacherBackend) computes the log-prob of every
response token of `--envs` requests (final-turn prompt + response), packed under its token
budget; reported as scored tokens (prompt + response) per second.

bf16 on CUDA, fp32 on CPU.

    python benchmarks/gpu_rollout.py --shape qwen3-1.7b
    python benchmarks/gpu_rollout.py --shape tiny --envs 2 --turns 2 --response-tokens 4   # CPU smoke test

RESULT decode_tokens_per_s=... reprefill_tokens_per_s=... reuse_over_reprefill=... score_tokens_per_s=...
"""

from __future__ import annotations

import argparse
import os
import random
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="qwen3-1.7b")
    parser.add_argument("--envs", type=int, default=32, help="episodes per generation batch")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=512, help="system prompt + task, first turn")
    parser.add_argument("--obs-tokens", type=int, default=64, help="tool response + next header, per turn")
    parser.add_argument("--response-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="torch threads on CPU")
    args = parser.parse_args()

    import torch

    from actors.engine import SamplingConfig
    from actors.hf_engine import HFEngine
    from learner.shapes import SHAPES, random_model
    from teacher.backends import HFTeacherBackend, ScoreRequest

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    if not cuda:
        torch.set_num_threads(args.threads)
    shape = SHAPES[args.shape]
    model = random_model(args.shape, "bfloat16" if cuda else "float32", device)
    engine = HFEngine(model, pad_token_id=0, stop_token_ids=[shape.vocab_size - 1])
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.response_tokens, seed=0)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def episodes(reuse_kv: bool) -> tuple[float, int, list[list[int]], list[tuple[int, ...]]]:
        """(seconds, generated tokens, last prompts, last responses) of one multi-turn batch."""
        rng = random.Random(0)
        engine.reuse_kv = reuse_kv
        engine.update_weights(model.state_dict(), version=0)  # drops any kept cache
        prompts = [[rng.randrange(1, shape.vocab_size - 1) for _ in range(args.prompt_tokens)]
                   for _ in range(args.envs)]
        seconds, generated, responses = 0.0, 0, []
        for turn in range(args.turns):
            sync()
            start = time.perf_counter()
            out = engine.generate(prompts, sampling)
            sync()
            seconds += time.perf_counter() - start
            generated += sum(len(g.token_ids) for g in out)
            responses = [g.token_ids for g in out]
            if turn + 1 < args.turns:
                prompts = [p + list(g.token_ids) + [rng.randrange(1, shape.vocab_size - 1)
                                                     for _ in range(args.obs_tokens)] for p, g in zip(prompts, out)]
        return seconds, generated, prompts, responses

    episodes(True)  # warm-up: kernels, allocator
    reuse_s, reuse_n, prompts, responses = episodes(True)
    prefill_s, prefill_n, _, _ = episodes(False)

    scorer = HFTeacherBackend(model, pad_token_id=0)
    requests = [ScoreRequest(tuple(p), tuple(r)) for p, r in zip(prompts, responses)]
    scorer.score(requests[:1])
    sync()
    start = time.perf_counter()
    scores = scorer.score(requests)
    sync()
    score_s = time.perf_counter() - start
    assert [len(s.logprobs) for s in scores] == [len(r) for r in responses]
    scored = sum(len(r.prompt_ids) + len(r.response_ids) for r in requests)

    decode, reprefill = reuse_n / reuse_s, prefill_n / prefill_s
    name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"{name}: {args.shape}, {args.envs} episodes x {args.turns} turns, final prompt "
          f"{max(map(len, prompts))} tokens; KV reuse {decode:.0f} tokens/s ({reuse_n} tokens), "
          f"re-prefill {reprefill:.0f} tokens/s ({prefill_n} tokens); teacher scoring {scored / score_s:.0f} tokens/s")
    print(f"RESULT decode_tokens_per_s={decode:.1f} reprefill_tokens_per_s={reprefill:.1f} "
          f"reuse_over_reprefill={decode / reprefill:.2f} score_tokens_per_s={scored / score_s:.1f} "
          f"shape={args.shape} envs={args.envs} turns={args.turns}")


if __name__ == "__main__":
    main()
