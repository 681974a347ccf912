"""ScienceWorld environment throughput with environment actors against in-process environments,
and what a JVM costs: its start, a task load (reset), a gold path's generation.

Part 1: JVM start (the first `simulator` use), then the reset of the first `--resets` dev tasks
(one per task type, round-robin) and the gold-path generation of the same tasks, in-process.
Part 2: the same episodes (the first `--episodes` dev tasks of the chosen task types, the
gold-path expert, K = `--envs` slots) run once with the K environments in-process (one after
another each round) and once with each in its own actor (actors/env_actor.py: a round's steps
and resets run concurrently). Env steps/s counts every environment step; loads and gold paths are
in the wall time. Every environment's JVM is started before the clock runs, as a worker's are.

    python benchmarks/scienceworld_envs.py [--envs 2] [--episodes 16] [--max-turns 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

SHORT_TYPES = ("find-non-living-thing", "lifespan-longest-lived", "use-thermometer", "chemistry-mix",
               "power-component", "find-animal", "identify-life-stages-2", "melt")
"""Types whose gold paths fit 30 steps (docs/scienceworld.md), so episodes end by the task."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", type=int, default=2)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--max-turns", type=int, default=30)
    parser.add_argument("--resets", type=int, default=30)
    args = parser.parse_args()

    from cluster.local import configure_loopback

    configure_loopback()
    import ray

    from actors.agent_loop import EpisodeTask, LoopConfig, run_episodes
    from actors.env_actor import RemoteEnv
    from actors.expert import ExpertPolicy
    from cluster.local import init_local_ray
    from envs.registry import make_env, parse_env_config

    config = parse_env_config({"name": "scienceworld", "max_steps": args.max_turns, "task_types": SHORT_TYPES})
    loop = LoopConfig(max_turns=args.max_turns)

    env = make_env(parse_env_config({"name": "scienceworld"}))
    start = time.perf_counter()
    env.simulator
    jvm_start = time.perf_counter() - start
    resets, golds = [], []
    for seed in range(args.resets):
        start = time.perf_counter()
        env.reset(seed, "dev")
        resets.append(time.perf_counter() - start)
        start = time.perf_counter()
        env.expert()
        golds.append(time.perf_counter() - start)
    env.close()
    print(f"JVM start {jvm_start:.2f} s; reset (load + reset) median {statistics.median(resets):.3f} s, "
          f"max {max(resets):.2f} s; gold path median {statistics.median(golds):.2f} s, max {max(golds):.2f} s "
          f"(first {args.resets} dev tasks)")

    init_local_ray(num_cpus=os.cpu_count() or 2)

    def play(make, tasks):
        start = time.perf_counter()
        results = run_episodes(make, tasks, ExpertPolicy(), loop, batch_size=args.envs)
        return results, time.perf_counter() - start

    local_envs = [make_env(config) for _ in range(args.envs)]
    try:
        tasks = [EpisodeTask("dev", s) for s in range(args.episodes)]
        remote_envs = [RemoteEnv(config) for _ in range(args.envs)]
        for warm in local_envs + remote_envs:
            warm.reset(0, "dev")  # the JVM starts at the first reset
        local, local_s = play(iter(local_envs).__next__, tasks)
        remote, remote_s = play(iter(remote_envs).__next__, tasks)
        # Some tasks are not step-for-step reproducible (docs/scienceworld.md): each run's steps
        # over its own wall time, and the episodes that played differently are counted.
        local_steps, remote_steps = sum(r.num_turns for r in local), sum(r.num_turns for r in remote)
        differ = sum((a.num_turns, a.success) != (b.num_turns, b.success) for a, b in
                     zip(sorted(local, key=lambda r: r.task.seed), sorted(remote, key=lambda r: r.task.seed)))
        inprocess, actors = local_steps / local_s, remote_steps / remote_s
        print(f"{args.episodes} episodes, K={args.envs}: in-process {local_steps} steps, "
              f"{sum(r.success for r in local)} won, {inprocess:.1f} steps/s ({local_s:.0f} s); {args.envs} env "
              f"actors {remote_steps} steps, {sum(r.success for r in remote)} won, {actors:.1f} steps/s "
              f"({remote_s:.0f} s); {differ} episode(s) played differently; {os.cpu_count()} cores")
        print(f"RESULT actors_over_inprocess={actors / inprocess:.2f} inprocess_steps_per_s={inprocess:.1f} "
              f"actors_steps_per_s={actors:.1f} jvm_start_s={jvm_start:.2f} "
              f"reset_median_s={statistics.median(resets):.3f} gold_path_median_s={statistics.median(golds):.2f}")
    finally:
        for local_env in local_envs:
            local_env.close()
        ray.shutdown()


if __name__ == "__main__":
    main()
