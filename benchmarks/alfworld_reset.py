"""ALFWorld game resets: textworld as shipped against this environment's kept translations.

A new game's reset builds its PDDL state twice (textworld's `load`, then `reset`), each build
translating the problem with fast_downward twice; `envs.alfworld.env` keeps the last
translations, so the repeated two are not redone (docs/alfworld.md). Each arm runs in a fresh
process on the same games (the first `--games` of valid_unseen, after one warm-up reset of
another game), the baseline with the kept translations switched off; the two must yield the
same observations.

    python benchmarks/alfworld_reset.py [--games 12] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def arm(games: int, data_dir: str | None, shipped: bool) -> dict:
    """Resets in this process: seconds per reset and a digest of the observations."""
    import hashlib

    from envs.alfworld import env as alfworld

    if shipped:
        alfworld._translate_each_game_once = lambda: None
    env = alfworld.AlfWorldEnv(alfworld.AlfWorldConfig(data_dir=data_dir))
    env.reset(games, "valid_unseen")  # imports and first-use costs, outside the timing
    digest = hashlib.sha256()
    start = time.perf_counter()
    for seed in range(games):
        digest.update(env.reset(seed, "valid_unseen").observation.encode())
    return {"s_per_reset": (time.perf_counter() - start) / games, "digest": digest.hexdigest()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--games", type=int, default=12)
    parser.add_argument("--data-dir", default=None, help="default: $ALFWORLD_DATA")
    parser.add_argument("--arm", choices=["shipped", "kept"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(arm(args.games, args.data_dir, args.arm == "shipped")))
        return
    results = {}
    for name in ("shipped", "kept"):
        command = [sys.executable, __file__, "--arm", name, "--games", str(args.games)]
        if args.data_dir:
            command += ["--data-dir", args.data_dir]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        results[name] = json.loads(out.strip().splitlines()[-1])
        print(f"{name:8s} {results[name]['s_per_reset']:.2f} s per reset", flush=True)
    if results["shipped"]["digest"] != results["kept"]["digest"]:
        raise SystemExit("the two arms reset to different observations")
    shipped, kept = results["shipped"]["s_per_reset"], results["kept"]["s_per_reset"]
    print(f"RESULT reset_speedup={shipped / kept:.2f} shipped_s_per_reset={shipped:.2f} kept_s_per_reset={kept:.2f} "
          f"games={args.games}")


if __name__ == "__main__":
    main()
