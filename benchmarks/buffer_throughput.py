"""Samples/s through (a) the buffer core in-process, (b) the Ray buffer actor, (c) ray.util.queue.Queue.

Same payloads, same pattern: P producer actors each put T trajectories of 10 turns
(full-history prompts of 700-1600 tokens, the shape of a BabyAI-Text episode), one GRPO
group of G trajectories per put; the driver
consumes batches of B samples and materialises them as one Arrow table. (b) passes one
encoded Arrow buffer per group, which the actor copies and puts back under its own ownership
(so samples outlive their producer), the groups since its last get in one object, and hands
out by reference, read zero-copy; (c) sends every sample
by value through the queue actor (batched puts, its best case). Put-to-get latency is
measured per trajectory. Goal: (b) at least 5x (c). Both sides batch their calls; buffer
puts do not wait for an answer (admission, not put, is the back-pressure), queue puts do
(its API is synchronous).

    python benchmarks/buffer_throughput.py [--producers 2] [--trajectories 100] [--batch 64]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from cluster.local import configure_loopback

configure_loopback()

import ray  # noqa: E402

from buffer.actor import BufferConfig, create_buffer_actor, encode_trajectories, fetch_samples  # noqa: E402
from buffer.contracts import Trajectory, Turn, samples_to_table  # noqa: E402
from buffer.core import Entry, RingBuffer  # noqa: E402
from buffer.expansion import expand  # noqa: E402
from cluster.local import init_local_ray  # noqa: E402

NUM_TURNS = 10


def make_trajectory(tid: str, rng: np.random.Generator) -> Trajectory:
    turns, prompt = [], rng.integers(0, 1000, 700).tolist()
    for k in range(NUM_TURNS):
        response = rng.integers(0, 1000, 20).tolist()
        turns.append(Turn(turn_index=k, prompt_ids=tuple(prompt), response_ids=tuple(response),
                          behaviour_logprobs=tuple(float(x) for x in -rng.random(20, dtype=np.float32)),
                          policy_version=0))
        prompt = prompt + response + rng.integers(0, 1000, 80).tolist()
    return Trajectory(tid, tid, "train", 0, "go_to", tuple(turns), False, -1.0, 0.5)


@ray.remote(num_cpus=0)
class Producer:
    def __init__(self, name: str, num_trajectories: int) -> None:
        rng = np.random.default_rng(hash(name) % 2**32)
        self.trajectories = [make_trajectory(f"{name}-{i}", rng) for i in range(num_trajectories)]

    def groups(self, group_size: int):
        for i in range(0, len(self.trajectories), group_size):
            yield self.trajectories[i:i + group_size]

    def run_buffer(self, buffer, group_size: int) -> dict[str, float]:
        # Puts never wait on the buffer (back-pressure comes from admission, not from put).
        sent, acks = {}, []
        for group in self.groups(group_size):
            batch = encode_trajectories(group)
            sent.update((t.trajectory_id, time.time()) for t in group)
            acks.append(buffer.put.remote(batch))
        ray.get(acks)
        return sent

    def run_queue(self, queue, group_size: int) -> dict[str, float]:
        sent = {}
        for group in self.groups(group_size):
            samples = [s for t in group for s in expand(t)]
            sent.update((t.trajectory_id, time.time()) for t in group)
            queue.put_nowait_batch(samples)
        return sent


def bench_core(trajectories: list[Trajectory], batch: int) -> float:
    samples = [s for t in trajectories for s in expand(t)]
    ring = RingBuffer(capacity=len(samples) + 1)
    start = time.perf_counter()
    for t in range(0, len(samples), NUM_TURNS):
        ring.put([Entry(0, s) for s in samples[t:t + NUM_TURNS]])
    consumed = 0
    while consumed < len(samples):
        got = ring.get(batch, learner_version=0)
        samples_to_table([e.payload for e in got])
        consumed += len(got)
    return len(samples) / (time.perf_counter() - start)


def latencies(sent: dict[str, float], received: dict[str, float]) -> list[float]:
    return [1000 * (received[k] - sent[k]) for k in sent]


def consume(start_producers, total: int, batch: int, take) -> tuple[float, list[float]]:
    """Start the producers, take batches (`take(n) -> Arrow table`) until `total` samples arrived."""
    start = time.perf_counter()
    pending = start_producers()
    consumed, received = 0, {}
    while consumed < total:
        table = take(min(batch, total - consumed))
        now = time.time()
        for tid in table.column("trajectory_id").to_pylist():
            received.setdefault(tid, now)
        consumed += table.num_rows
    rate = total / (time.perf_counter() - start)
    sent = {k: v for d in ray.get(pending) for k, v in d.items()}
    return rate, latencies(sent, received)


def bench_actor(producers, total: int, batch: int, group: int) -> tuple[float, list[float]]:
    buffer = create_buffer_actor(BufferConfig(capacity_samples=total + 1, batch_size=batch))
    ray.get(buffer.stats.remote())
    result = consume(lambda: [p.run_buffer.remote(buffer, group) for p in producers], total, batch,
                     lambda n: fetch_samples(ray.get(buffer.get.remote(n, learner_version=0, timeout_s=30))))
    ray.kill(buffer)
    return result


def bench_queue(producers, total: int, batch: int, group: int) -> tuple[float, list[float]]:
    from ray.util.queue import Empty, Queue

    queue = Queue(actor_options={"num_cpus": 0})
    queue.size()  # wait until the queue actor is up, as for the buffer actor

    def take(n: int):
        try:
            return samples_to_table(queue.get_nowait_batch(n))
        except Empty:
            return samples_to_table([queue.get(block=True, timeout=30)])

    result = consume(lambda: [p.run_queue.remote(queue, group) for p in producers], total, batch, take)
    queue.shutdown()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--trajectories", type=int, default=100, help="per producer")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--group", type=int, default=8, help="trajectories per put (a GRPO group)")
    args = parser.parse_args()
    init_local_ray(num_cpus=2)
    try:
        producers = [Producer.remote(f"p{i}", args.trajectories) for i in range(args.producers)]
        ray.get([p.__ray_ready__.remote() for p in producers])
        total = args.producers * args.trajectories * NUM_TURNS
        rng = np.random.default_rng(0)
        core = bench_core([make_trajectory(f"c{i}", rng) for i in range(args.trajectories)], args.batch)
        actor, actor_lat = bench_actor(producers, total, args.batch, args.group)
        queue, queue_lat = bench_queue(producers, total, args.batch, args.group)
        p50, p99 = np.percentile(actor_lat, [50, 99])
        q50, q99 = np.percentile(queue_lat, [50, 99])
        print(f"samples={total} producers={args.producers} group={args.group} batch={args.batch}")
        print(f"(a) core in-process      {core:10.0f} samples/s")
        print(f"(b) buffer actor         {actor:10.0f} samples/s   put->get p50 {p50:.1f} ms  p99 {p99:.1f} ms")
        print(f"(c) ray.util.queue.Queue {queue:10.0f} samples/s   put->get p50 {q50:.1f} ms  p99 {q99:.1f} ms")
        print(f"actor/queue = {actor / queue:.2f}x (goal >= 5x)   core/actor = {core / actor:.1f}x")
        print(f"RESULT core_samples_per_s={core:.0f} actor_samples_per_s={actor:.0f} queue_samples_per_s={queue:.0f} "
              f"actor_over_queue={actor / queue:.2f} p99_ms={p99:.1f}")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
