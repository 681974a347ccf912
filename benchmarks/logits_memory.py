"""Peak memory and time of the learner's log-probs: at the trained positions in chunks against
full-vocabulary logits at every position.

The learner used to compute the LM head and an fp32 log-softmax over every position of a
micro-batch: ~16 bytes per token per vocabulary entry at its peak (fp32 logits, the log-softmax
kept for the backward pass, the entropy's temporaries), 2.4 MB a token at Qwen3's 151,936-token
vocabulary, so the gpu-8 presets' 32,768-token micro-batches asked ~80 GB for it alone. It now runs
the head only where the loss reads a log-prob (the trained response tokens), a chunk of
`HEAD_CHUNK_POSITIONS` at a time, recomputed in the backward pass (`learner.trainer.logprobs_at`;
docs/architecture.md, "Logits where the loss reads them").

Each arm runs in a process of its own (peak resident memory is per process): a Qwen3-vocabulary
model cut to `--layers` blocks of Qwen3-0.6B's width (the head's cost depends on the vocabulary,
the width and the positions, not the depth), buffer-like packed multi-turn sequences of one
micro-batch (`benchmarks/gpu_learner.py`'s: responses of 16-64 tokens between observations of
32-96), one forward and backward of the OPD-style sum over trained tokens, after a warm-up pass.

    python benchmarks/logits_memory.py [--tokens 2048] [--layers 2] [--threads 2]

Ends with `RESULT head_peak_mem_ratio=... full_peak_mib=... trained_peak_mib=... full_s=... trained_s=...
step_speedup=... trained_frac=...` (peaks above the process's resident memory before the first pass).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def full_logprobs(model, batch):
    """The learner's computation before: logits and log-softmax at every position [N, T, V]."""
    import torch

    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logp_all = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    logp = logp_all.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1).detach()
    return torch.nn.functional.pad(logp, (1, 0)), torch.nn.functional.pad(entropy, (1, 0))


def run_arm(arm: str, tokens: int, layers: int, threads: int) -> dict:
    import torch

    from gpu_learner import packed_sequences  # benchmarks/ is on sys.path when run as a script
    from learner.shapes import SHAPES, random_model
    from learner.trainer import collate, token_logprobs

    torch.set_num_threads(threads)
    model = random_model("qwen3-0.6b", num_hidden_layers=layers).train()
    sequences = packed_sequences(tokens, min(tokens, 2048), SHAPES["qwen3-0.6b"].vocab_size, "opd", seed=0)
    batch = collate(sequences, 0, 0)
    compute = full_logprobs if arm == "full" else token_logprobs
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(2):  # a warm-up pass, then the timed one
        start = time.perf_counter()
        logp, _ = compute(model, batch)
        (logp * batch.loss_mask).sum().backward()
        model.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_mib": (peak - base) / 1024, "seconds": times[-1], "tokens": int(batch.attention_mask.sum()),
            "trained": int(batch.loss_mask.sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=2048, help="tokens in the micro-batch")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--arm", choices=("full", "trained"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(run_arm(args.arm, args.tokens, args.layers, args.threads)))
        return
    results = {}
    for arm in ("full", "trained"):
        out = subprocess.run([sys.executable, __file__, "--arm", arm, "--tokens", str(args.tokens), "--layers",
                              str(args.layers), "--threads", str(args.threads)],
                             capture_output=True, text=True, check=True)
        results[arm] = json.loads(out.stdout.strip().splitlines()[-1])
        r = results[arm]
        print(f"{arm}: {r['tokens']} tokens ({r['trained']} trained), peak +{r['peak_mib']:.0f} MiB, "
              f"forward+backward {r['seconds']:.2f} s", flush=True)
    full, trained = results["full"], results["trained"]
    print(f"RESULT head_peak_mem_ratio={full['peak_mib'] / trained['peak_mib']:.2f} "
          f"full_peak_mib={full['peak_mib']:.0f} trained_peak_mib={trained['peak_mib']:.0f} "
          f"full_s={full['seconds']:.2f} trained_s={trained['seconds']:.2f} "
          f"step_speedup={full['seconds'] / trained['seconds']:.2f} "
          f"trained_frac={trained['trained'] / trained['tokens']:.2f}")


if __name__ == "__main__":
    main()
