"""Success rate and mean steps of the BabyAI bot per task type (expected: about 1.0 everywhere).

    python benchmarks/expert_success.py [--seeds-per-type 200] [--split train]
"""

from __future__ import annotations

import argparse
import time

from envs.babyai_text import TASK_TYPES, BabyAITextConfig, BabyAITextEnv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds-per-type", type=int, default=200)
    parser.add_argument("--split", default="train", choices=["train", "eval"])
    args = parser.parse_args()
    start = time.perf_counter()
    rates = {}
    print(f"{'task type':<22}{'episodes':>9}{'success':>9}{'mean steps':>12}")
    for task_type in TASK_TYPES:
        env = BabyAITextEnv(BabyAITextConfig(task_types=(task_type,)))
        successes, steps = 0, 0
        for seed in range(args.seeds_per_type):
            env.reset(seed, args.split)
            expert, last, step = env.expert(), None, None
            while step is None or not step.done:
                last = expert.act(last)
                if last is None:
                    break
                step = env.step(last)
            successes += bool(step and step.success)
            steps += step.num_steps if step else 0
        rates[task_type] = successes / args.seeds_per_type
        print(f"{task_type:<22}{args.seeds_per_type:>9}{rates[task_type]:>9.3f}{steps / args.seeds_per_type:>12.1f}")
    overall = sum(rates.values()) / len(rates)
    print(f"wall {time.perf_counter() - start:.1f}s")
    print("RESULT " + " ".join(f"{t}={r:.3f}" for t, r in rates.items()) + f" overall={overall:.3f}")


if __name__ == "__main__":
    main()
