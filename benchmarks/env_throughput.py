"""BabyAI-Text env steps/s with text rendering vs raw minigrid `step`, same episodes, one process.

Both sides replay identical (seed, action) sequences; only the step calls are timed (resets
are not). Goal: the text env costs at most 2x the raw step (text_cost_ratio <= 2).

    python benchmarks/env_throughput.py [--episodes 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import time

from envs.babyai_text import BabyAITextEnv
from envs.babyai_text.env import ACTION_TOOLS
from envs.babyai_text.level import MixedTrainLocalLevel, num_rooms
from envs.babyai_text.tasks import task_spec
from envs.protocol import ToolCall

TOOL_CALLS = [ToolCall(name) for name, _ in ACTION_TOOLS]


def episodes(num_episodes: int, max_len: int, seed: int) -> list[tuple[int, list[int]]]:
    """(task seed, random action sequence), cut where the episode ends."""
    rng = random.Random(seed)
    env = BabyAITextEnv()
    plan = []
    for task_seed in range(num_episodes):
        env.reset(task_seed, "train")
        actions = []
        for _ in range(max_len):
            action = rng.randrange(6)
            actions.append(action)
            if env.step_action(action).done:
                break
        plan.append((task_seed, actions))
    return plan


def time_raw(plan) -> tuple[float, int]:
    levels = {n: MixedTrainLocalLevel(num_cols=n) for n in (1, 2)}
    elapsed, steps = 0.0, 0
    for task_seed, actions in plan:
        spec = task_spec("train", task_seed)
        level = levels[num_rooms(spec.task_type)]
        level.task_type = spec.task_type
        level.reset(seed=spec.level_seed)
        start = time.perf_counter()
        for action in actions:
            level.step(action)
        elapsed += time.perf_counter() - start
        steps += len(actions)
    return elapsed, steps


def time_text(plan) -> tuple[float, int]:
    env = BabyAITextEnv()
    elapsed, steps = 0.0, 0
    for task_seed, actions in plan:
        env.reset(task_seed, "train")
        start = time.perf_counter()
        for action in actions:
            env.step(TOOL_CALLS[action])
        elapsed += time.perf_counter() - start
        steps += len(actions)
    return elapsed, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--max-len", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    plan = episodes(args.episodes, args.max_len, seed=0)
    raw_best = text_best = 0.0
    for _ in range(args.repeats):
        # Interleaved so both sides see the same machine load.
        t, n = time_raw(plan)
        raw_best = max(raw_best, n / t)
        t, n = time_text(plan)
        text_best = max(text_best, n / t)
    steps = sum(len(a) for _, a in plan)
    print(f"episodes={len(plan)} steps={steps} repeats={args.repeats} (best of)")
    print(f"raw minigrid step:      {raw_best:9.0f} steps/s")
    print(f"text env step + render: {text_best:9.0f} steps/s")
    print(f"text costs {raw_best / text_best:.2f}x the raw step (goal <= 2)")
    print(f"RESULT text_steps_per_s={text_best:.0f} raw_steps_per_s={raw_best:.0f} "
          f"text_cost_ratio={raw_best / text_best:.3f}")


if __name__ == "__main__":
    main()
