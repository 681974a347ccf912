"""ALFWorld environment throughput with environment actors against in-process environments, and
the package expert's success per split.

Part 1: the same episodes (the first `--episodes` games of valid_unseen, the expert policy, K =
`--envs` slots) run once with the K environments in-process (one after another each round) and
once with each in its own actor (actors/env_actor.py: a round's steps and resets run
concurrently). Env steps/s counts every environment step, game loads included in the wall time.
Goal: actors_over_inprocess >= 1.6 on 2 cores (more with more cores).

Part 2 (`--expert-splits`): the expert on every game of each split, through env actors.
The expert is ALFWorld's hand-coded one on games rebuilt with the package's domain (docs/alfworld.md).

    python benchmarks/alfworld_envs.py [--envs 2] [--episodes 16] [--expert-splits valid_seen,valid_unseen]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", type=int, default=2)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--max-turns", type=int, default=50)
    parser.add_argument("--expert-splits", default="valid_seen,valid_unseen")
    parser.add_argument("--data-dir", default=None, help="default: $ALFWORLD_DATA")
    args = parser.parse_args()

    from cluster.local import configure_loopback

    configure_loopback()
    import ray

    from actors.agent_loop import EpisodeTask, LoopConfig, run_episodes
    from actors.env_actor import RemoteEnv
    from actors.expert import ExpertPolicy
    from cluster.local import init_local_ray
    from envs.registry import make_env, parse_env_config
    from jobs.evaluate import format_table, summarize

    config = parse_env_config({"name": "alfworld", **({"data_dir": args.data_dir} if args.data_dir else {})})
    loop = LoopConfig(max_turns=args.max_turns)
    init_local_ray(num_cpus=os.cpu_count() or 2)

    def play(make, tasks):
        start = time.perf_counter()
        results = run_episodes(make, tasks, ExpertPolicy(), loop, batch_size=args.envs)
        return results, time.perf_counter() - start

    def actor_factory():
        envs = [RemoteEnv(config) for _ in range(args.envs)]
        for env in envs:  # started (package imported) before the clock runs, as a worker's are
            env.split_size("valid_unseen")
        return envs

    try:
        tasks = [EpisodeTask("valid_unseen", s) for s in range(args.episodes)]
        make_env(config).split_size("valid_unseen")  # builds the game list and rebuilt-game cache once
        play(lambda: make_env(config), tasks[:args.envs])  # warm the rebuilt-game cache
        local, local_s = play(lambda: make_env(config), tasks)
        envs = actor_factory()
        remote, remote_s = play(iter(envs).__next__, tasks)
        steps = sum(r.num_turns for r in local)
        assert steps == sum(r.num_turns for r in remote), "the two runs played different episodes"
        inprocess, actors = steps / local_s, steps / remote_s
        print(f"{args.episodes} episodes, {steps} env steps, K={args.envs}: in-process {inprocess:.1f} steps/s "
              f"({local_s:.0f} s), {args.envs} env actors {actors:.1f} steps/s ({remote_s:.0f} s), "
              f"{os.cpu_count()} cores")
        success = {}
        for split in [s for s in args.expert_splits.split(",") if s]:
            n = make_env(config).split_size(split)
            results, wall = play(iter(envs).__next__, [EpisodeTask(split, s) for s in range(n)])
            success[split] = (sum(r.success for r in results), n)
            print(f"\nexpert on {split}: {success[split][0]}/{n} won in {wall:.0f} s")
            print(format_table(summarize(results)))
        wins = " ".join(f"expert_{split}={won}/{n}" for split, (won, n) in success.items())
        print(f"RESULT actors_over_inprocess={actors / inprocess:.2f} inprocess_steps_per_s={inprocess:.1f} "
              f"actors_steps_per_s={actors:.1f} {wins}")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
