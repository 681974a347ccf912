"""Learner step throughput, MFU and peak memory at real Qwen3 shapes (no Ray, no weights).

One FSDP2 learner rank per process (NCCL on CUDA, gloo on CPU; run under torchrun for more),
the production `learner.trainer.Trainer` (bf16 parameters with fp32 gradient reduction on GPU,
fp32 on CPU) training a randomly initialised model of the named shape on packed multi-turn
sequences shaped like the buffer's: a long task prompt, then turns of (response, observation)
with the loss on responses only, episode lengths spread between a quarter and all of
`--seq-len`. The loss is OPD (teacher log-probs on every response token) or GRPO (clipped
ratio with advantages).

MFU is model FLOPs per second (learner.shapes.Shape.train_flops: 6 per weight per token plus
causal attention) over the dense-matmul ceiling measured in the same run on the same device
(bf16 GEMMs on CUDA; fp32 on CPU, where the learner runs fp32). The H200's data-sheet bf16
dense peak (~989 TFLOP/s; ~790 measured) is printed beside it for reference.

    python benchmarks/gpu_learner.py --shape qwen3-1.7b [--loss opd|grpo] [--steps 4]
    torchrun --nproc-per-node 2 benchmarks/gpu_learner.py --shape qwen3-1.7b
    python benchmarks/gpu_learner.py --shape tiny --steps 1 --warmup 0   # CPU smoke test

RESULT tokens_per_s=... mfu=... peak_mem_gib=... (plus shape, loss, ceiling_tflops).
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def matmul_ceiling_tflops(device, dtype) -> float:
    """Best sustained TFLOP/s of square GEMMs on this device (the MFU denominator)."""
    import torch

    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    repeats = 20 if device.type == "cuda" else 3
    best = 0.0
    for _ in range(3):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = max(best, 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12)
    return best


def packed_sequences(num_tokens: int, seq_len: int, vocab_size: int, loss: str, seed: int):
    """Buffer-like packed episodes totalling about `num_tokens` tokens."""
    import random

    from buffer.expansion import TrainSequence

    rng = random.Random(seed)
    out, total = [], 0
    while total < num_tokens:
        length = rng.randint(seq_len // 4, seq_len)
        ids, mask, turns = [], [], []
        prompt = min(length // 4, 256)
        ids += [rng.randrange(1, vocab_size) for _ in range(prompt)]
        mask += [False] * prompt
        turns += [-1] * prompt
        turn = 0
        while len(ids) < length:
            response = min(rng.randint(16, 64), length - len(ids))
            ids += [rng.randrange(1, vocab_size) for _ in range(response)]
            mask += [True] * response
            turns += [turn] * response
            observation = min(rng.randint(32, 96), length - len(ids))
            ids += [rng.randrange(1, vocab_size) for _ in range(observation)]
            mask += [False] * observation
            turns += [-1] * observation
            turn += 1
        behaviour = [-rng.random() * 3 if m else 0.0 for m in mask]
        out.append(TrainSequence(
            token_ids=tuple(ids), loss_mask=tuple(mask), turn_index=tuple(turns),
            behaviour_logprobs=tuple(behaviour),
            teacher_logprobs=tuple(b - rng.random() if m else 0.0 for b, m in zip(behaviour, mask))
            if loss == "opd" else None,
            policy_version=tuple(0 if m else -1 for m in mask),
            advantage=tuple((rng.choice((-1.0, 1.0)) if m else 0.0) for m in mask),
            turn_reward=tuple(0.0 for _ in mask)))
        total += length
    return out


def init_process_group(device_type: str) -> None:
    """torchrun's group, or a one-rank group on loopback when run as a plain script."""
    import torch.distributed as dist

    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="qwen3-1.7b")
    parser.add_argument("--loss", choices=("opd", "grpo"), default="opd")
    parser.add_argument("--steps", type=int, default=4, help="timed optimizer steps")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (allocator, kernels)")
    parser.add_argument("--seq-len", type=int, default=4096, help="longest packed episode")
    parser.add_argument("--batch-tokens", type=int, default=65536, help="tokens per step on this rank")
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--threads", type=int, default=2, help="torch threads on CPU")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    from learner.algorithms import AlgorithmConfig
    from models.loading import ModelConfig
    from learner.shapes import SHAPES, random_model
    from learner.trainer import LearnerConfig, Trainer

    cuda = torch.cuda.is_available()
    init_process_group("cuda" if cuda else "cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        torch.set_num_threads(args.threads)
        device = torch.device("cpu")
    try:
        shape = SHAPES[args.shape]
        config = LearnerConfig(algorithm=AlgorithmConfig(name=args.loss), lr=1e-5,
                               micro_batch_tokens=args.micro_batch_tokens,
                               activation_checkpointing=args.activation_checkpointing)
        # The model is built in fp32 (the optimizer's master weights); FSDP2 computes in bf16 on GPU.
        trainer = Trainer(config, ModelConfig(dtype="bfloat16" if cuda else "float32"), device=str(device),
                          module=random_model(args.shape, "float32", str(device)))
        ceiling = matmul_ceiling_tflops(device, torch.bfloat16 if cuda else torch.float32)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        times, tokens, flops = [], 0, 0.0
        for step in range(args.warmup + args.steps):
            batch = packed_sequences(args.batch_tokens, args.seq_len, shape.vocab_size, args.loss,
                                     seed=step * world + rank)
            start = time.perf_counter()
            stats = trainer.train_step(batch)
            if cuda:
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            if step >= args.warmup:
                times.append(elapsed)
                tokens += sum(s.num_tokens for s in batch)
                flops += shape.train_flops([s.num_tokens for s in batch])
            if rank == 0:
                print(f"step {step} {'(warm-up) ' if step < args.warmup else ''}{elapsed:.2f} s "
                      f"loss {stats['loss']:.4f} tokens {stats['num_tokens']:.0f}", flush=True)
        seconds = sum(times)
        totals = torch.tensor([tokens, flops], dtype=torch.float64)
        dist.all_reduce(totals)
        seconds = max(seconds, 1e-9)
        tokens_per_s = totals[0].item() / seconds
        mfu = totals[1].item() / seconds / world / (ceiling * 1e12)
        peak = (torch.cuda.max_memory_allocated(device) if cuda
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) / 2**30
        if rank == 0:
            name = torch.cuda.get_device_name(device) if cuda else "cpu"
            print(f"{name}: {world} rank(s), {args.shape} ({shape.matmul_params() / 1e6:.0f}M matmul weights), "
                  f"{args.loss}, {tokens_per_s:.0f} tokens/s, {totals[1].item() / seconds / 1e12:.1f} TFLOP/s "
                  f"of a measured {ceiling:.1f} TFLOP/s ceiling per device")
            print(f"RESULT tokens_per_s={tokens_per_s:.1f} mfu={mfu:.3f} peak_mem_gib={peak:.2f} "
                  f"shape={args.shape} loss={args.loss} ceiling_tflops={ceiling:.1f} world_size={world}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Gloo's worker threads can still abort the interpreter's teardown after the group is destroyed
    # ("terminate called without an active exception", exit 134, seen once in CI after the RESULT
    # line; pytorch/pytorch#179291): everything is printed, so leave without the teardown.
    sys.stdout.flush()
    os._exit(0)
