"""Learner tokens and step time for 20-turn full-history episodes: packed vs expanded samples.

An n-turn episode expands to n samples whose prompts repeat the whole history (O(n^2)
tokens); packed, the episode is one sequence with n loss-masked responses (O(n)). Same
gradient either way (tests/unit/test_trainer.py checks it).

    python benchmarks/packing.py [--episodes 4] [--turns 20] [--model tiny:tiny]
"""

from __future__ import annotations

import argparse
import os
import random
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--model", default="tiny:tiny")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    from buffer.contracts import Trajectory, Turn
    from buffer.expansion import expand, to_sequences
    from learner.algorithms import AlgorithmConfig
    from cluster.local import free_port
    from models.loading import ModelConfig
    from learner.trainer import LearnerConfig, Trainer

    torch.set_num_threads(args.threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    rng = random.Random(0)
    trajectories = []
    for e in range(args.episodes):
        prompt, turns = tuple(rng.randrange(600) for _ in range(700)), []
        for k in range(args.turns):
            response = tuple(rng.randrange(600) for _ in range(20))
            turns.append(Turn(k, prompt, response, tuple(-1.0 for _ in response), 0,
                              teacher_logprobs=tuple(-0.5 for _ in response)))
            prompt = prompt + response + tuple(rng.randrange(600) for _ in range(60))
        trajectories.append(Trajectory(f"e{e}", f"g{e}", "train", e, "go_to", tuple(turns), True, 1.0, 0.5))
    samples = [s for t in trajectories for s in expand(t)]
    results = {}
    for name, packing in (("packed", True), ("expanded", False)):
        sequences = to_sequences(samples, packing=packing)
        trainer = Trainer(LearnerConfig(algorithm=AlgorithmConfig(name="opd"), micro_batch_tokens=8192),
                          ModelConfig(path=args.model))
        trainer.train_step(sequences)  # warm-up
        start = time.perf_counter()
        for _ in range(args.repeats):
            stats = trainer.train_step(sequences)
        results[name] = (stats["num_tokens"], (time.perf_counter() - start) / args.repeats, len(sequences))
        print(f"{name:>8}: {len(sequences):4d} sequences, {stats['num_tokens']:9.0f} tokens, "
              f"{results[name][1]:7.2f} s/step, {stats['num_loss_tokens']:.0f} loss tokens")
    dist.destroy_process_group()
    tokens = results["expanded"][0] / results["packed"][0]
    seconds = results["expanded"][1] / results["packed"][1]
    print(f"expanded/packed: {tokens:.2f}x tokens, {seconds:.2f}x step time "
          f"({args.episodes} episodes x {args.turns} turns, model {args.model})")
    print(f"RESULT expanded_over_packed_tokens={tokens:.2f} expanded_over_packed_time={seconds:.2f}")


if __name__ == "__main__":
    main()
