"""Does relabelling the student's own states (DAgger) teach what cloning the bot does not?

A student cloned on the bot's episodes of a level with distractors learns to walk to the object
the instruction names (go_to) but picks up whatever it faces on the way (pick_up: every failure
`object_choice`): the bot plans around distractors, so its episodes hardly ever show a state
facing one, let alone the call to make there. DAgger (Ross et al., 2011) puts those states in
the data: the student plays, the bot labels every state the student reached with its own call,
and the student trains on the aggregate of every round's data and the bot's episodes.

Offline, in one process, from an exported policy (e.g. a `benchmarks/mixed_hour.py` stage's
`hf/`), each arm for the same wall clock, SFT on the tool-call turns with a cosine rate ending
at the arm's end:

- `clone`: the bot's fresh episodes only (what a mixed_hour stage does);
- `dagger`: rounds of (roll out the current student on fresh train tasks, sampling at
  temperature 1; label each reached state with the bot's call, advised of what the student
  actually did: `env.expert_deviation`), each round's labelled turns added to the aggregate with
  the bot's episodes, half of every batch from each;
- `dart`: the bot's episodes with noise injected (DART, Laskey et al., 2017): at each turn the
  bot's call is executed, or with probability `--noise` another tool drawn uniformly, and every
  state is labelled with the bot's call. Off-path states (facing a distractor, holding the wrong
  object) enter the data as in DAgger, without the student's roll-outs: collected like the
  `clone` arm's episodes, before the clock starts, at the cost of environment steps only.

The measure is greedy success on `--eval-tasks` eval tasks of the level, per task type, and how
often the policy calls `pick_up`.

    python benchmarks/dagger_probe.py --model DIR|tiny:PRESET [--seconds 300] [--room-size 6]
        [--distractors 2] [--task-types go_to,pick_up] [--arms clone,dagger,dart] [--noise 0.3]
        [--deviation undo|replan] [--observation-order scan|nearest] [--save-rounds DIR] [--seed 0]
        [--rounds 4] [--round-episodes 128]

(`tiny:PRESET`: a student from scratch, the tiny factory's model.)

Ends with `RESULT success_start=... success_<arm>=... pick_up_share_<arm>=...
pick_up_success_<arm>=...` (pick_up_success: greedy success on the `pick_up` tasks).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import time
from collections import Counter
from typing import get_args

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from transformers import AutoModelForCausalLM

from actors.agent_loop import ChatPrompter, EpisodeTask, LoopConfig, ModelPolicy, run_episodes
from actors.engine import SamplingConfig
from actors.expert import _expert_call
from actors.hf_engine import HFEngine
from clone_probe import Sample, bot_turns, sft_step  # benchmarks/ is on sys.path when run as a script
from envs.babyai_text import BabyAITextConfig
from envs.babyai_text.text_obs import ObservationOrder
from envs.parser import format_tool_call
from envs.registry import make_env
from jobs.evaluate import executed_calls
from models.loading import ModelConfig, load_tokenizer
from models.tiny import tiny_model_dir

STOP = "<|im_end|>"
ARMS = ("clone", "dagger", "dart")


class Labelled:
    """The student plays; every turn also records (prompt, the bot's call at that state)."""

    def __init__(self, student: ModelPolicy, tokenizer, loop: LoopConfig) -> None:
        self.student = student
        self.prompter = ChatPrompter(tokenizer, loop, STOP)
        self.experts: dict[tuple[str, int], list] = {}
        """Each episode's bot (made at its first turn, the task's start) and its latest call."""
        self.samples: list[Sample] = []

    def respond(self, episodes):
        for ep in episodes:
            key = (ep.task.split, ep.task.seed)
            if key not in self.experts:
                self.experts[key] = [ep.env.expert(), None]
            expert = self.experts[key]
            # As the oracle teacher does (teacher/oracle.py): the bot is advised of executed calls
            # only; after a turn that executed nothing its call stands.
            if not ep.history or ep.history[-1].call is not None:
                expert[1] = _expert_call(ep, expert[0])
            prompt = self.prompter.prompt_ids(ep, ep.policy_state)
            label = self.prompter.canonical_text(format_tool_call(expert[1]), prompt, 0)
            self.samples.append((tuple(prompt), tuple(label.response_ids)))
        return self.student.respond(episodes)


def load_student(name: str):
    """An exported policy directory, or `tiny:PRESET` for the tiny factory's untrained model."""
    path = tiny_model_dir(name.removeprefix("tiny:")) if name.startswith("tiny:") else name
    return AutoModelForCausalLM.from_pretrained(path)


def policy(model, tokenizer, loop: LoopConfig, temperature: float, seed: int) -> ModelPolicy:
    engine = HFEngine(model, tokenizer.pad_token_id, [tokenizer.convert_tokens_to_ids(STOP)], reuse_kv=False)
    return ModelPolicy(engine, tokenizer, SamplingConfig(temperature=temperature, max_new_tokens=24, seed=seed), loop)


def evaluate(model, tokenizer, loop, env, num_tasks: int, split: str = "eval") -> tuple[float, dict[str, float], float]:
    """Greedy success overall and per task type, and `pick_up`'s share of the executed calls."""
    model.eval()
    tasks = [EpisodeTask(split, i) for i in range(num_tasks)]
    with torch.no_grad():
        results = run_episodes(lambda: make_env(env), tasks, policy(model, tokenizer, loop, 0.0, 0), loop, batch_size=32)
    model.train()
    by_type: dict[str, list[bool]] = {}
    for r in results:
        by_type.setdefault(r.info.task_type, []).append(r.success)
    calls = Counter(call.name for r in results for call in executed_calls(r) if call is not None)
    return (sum(r.success for r in results) / len(results), {k: sum(v) / len(v) for k, v in sorted(by_type.items())},
            calls["pick_up"] / max(sum(calls.values()), 1))


def train(model, optimizer, batches, seconds: float, lr: float, span: tuple[float, float] = (0.0, 1.0)) -> int:
    """SFT for `seconds` along the part `span` of one cosine from `lr` to 0; `batches()` gives
    the next batch. The steps taken."""
    start, steps = time.monotonic(), 0
    while (done := (time.monotonic() - start) / seconds) < 1:
        at = span[0] + (span[1] - span[0]) * done
        for group in optimizer.param_groups:
            group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * at))
        sft_step(model, optimizer, batches())
        steps += 1
    return steps


def sampler(pools: list[list[Sample]], batch: int, rng: random.Random):
    """Batches drawn equally from each non-empty pool (the aggregate of DAgger's rounds and the bot's)."""
    def draw() -> list[Sample]:
        live = [p for p in pools if p]
        return [rng.choice(live[i % len(live)]) for i in range(batch)]
    return draw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="an exported HF policy directory")
    parser.add_argument("--seconds", type=float, default=300.0, help="training wall clock per arm")
    parser.add_argument("--rounds", type=int, default=4, help="DAgger's roll-out rounds within its time")
    parser.add_argument("--round-episodes", type=int, default=128)
    parser.add_argument("--room-size", type=int, default=6)
    parser.add_argument("--distractors", type=int, default=2)
    parser.add_argument("--task-types", default="go_to,pick_up")
    parser.add_argument("--eval-tasks", type=int, default=100)
    parser.add_argument("--eval-split", default="eval", help="e.g. eval50: the study's 50 tasks")
    parser.add_argument("--batch", type=int, default=32, help="turns per step")
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--arms", default="clone,dagger", help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--noise", type=float, default=0.3, help="dart: the share of turns executing another tool")
    parser.add_argument("--deviation", choices=("undo", "replan"), default="undo",
                        help="the bot's advice after a call it did not suggest (env.expert_deviation)")
    parser.add_argument("--observation-order", choices=get_args(ObservationOrder), default="scan",
                        help="env.observation_order: BabyAI-Text's, or the cell in front first")
    parser.add_argument("--seed", type=int, default=0,
                        help="the batches' draws, DAgger's sampling and its roll-outs' tasks (a second run)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--save-rounds", metavar="DIR",
                        help="save the DAgger student after each round as DIR/round_<k> (a curve, evaluated later)")
    args = parser.parse_args()
    args.arms = args.arms.split(",")
    if unknown := set(args.arms) - set(ARMS):
        parser.error(f"unknown arms {sorted(unknown)}; known: {', '.join(ARMS)}")
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(ModelConfig(path=args.model))
    loop = LoopConfig(max_turns=20, max_context_tokens=1024,
                      prompt={"history_window": 0, "tools": "compact", "system_message": False})
    env = BabyAITextConfig(room_size=args.room_size, num_distractors=args.distractors,
                           task_types=tuple(args.task_types.split(",")), expert_deviation=args.deviation,
                           observation_order=args.observation_order)
    bot = bot_turns(tokenizer, loop, env, 700_000_000, 4096)
    results = {"start": evaluate(load_student(args.model), tokenizer, loop, env, args.eval_tasks, args.eval_split)}
    print(f"start: {results['start']}", flush=True)

    rng = random.Random(args.seed)
    if "clone" in args.arms:
        steps, results["clone"] = cloned(args, tokenizer, loop, env, bot, rng)
        print(f"clone: {steps} steps, {len(bot)} turns, {results['clone']}", flush=True)
    if "dagger" in args.arms:
        results["dagger"] = dagger(args, tokenizer, loop, env, bot, rng)
    if "dart" in args.arms:
        clock = time.monotonic()
        noisy = bot_turns(tokenizer, loop, env, 700_000_000, 4096, args.noise)
        collected = time.monotonic() - clock
        steps, results["dart"] = cloned(args, tokenizer, loop, env, noisy, rng)
        print(f"dart: {steps} steps, {len(noisy)} turns collected in {collected:.0f} s, {results['dart']}", flush=True)
    print("RESULT " + " ".join(f"success_{arm}={s:.3f}" for arm, (s, _, _) in results.items()) + " "
          + " ".join(f"pick_up_share_{arm}={p:.3f}" for arm, (_, _, p) in results.items()) + " "
          + " ".join(f"pick_up_success_{arm}={by_type.get('pick_up', float('nan')):.3f}"
                     for arm, (_, by_type, _) in results.items()))


def cloned(args, tokenizer, loop, env, turns: list[Sample], rng: random.Random):
    """SFT on `turns` alone for the arm's time: the steps taken and the evaluation."""
    model = load_student(args.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    steps = train(model, optimizer, sampler([turns], args.batch, rng), args.seconds, args.lr)
    return steps, evaluate(model, tokenizer, loop, env, args.eval_tasks, args.eval_split)


def dagger(args, tokenizer, loop, env, bot: list[Sample], rng: random.Random):
    """The DAgger arm: rounds of roll-out and relabelling, training on the aggregate; its evaluation."""
    model = load_student(args.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    relabelled: list[Sample] = []
    clock, steps, labelled_turns = time.monotonic(), 0, 0
    for round_ in range(args.rounds):
        # The rounds' roll-outs count against the arm's time: an hour pays for them too.
        player = Labelled(policy(model, tokenizer, loop, 1.0, args.seed * 100_003 + round_), tokenizer, loop)
        first = 800_000_000 + args.seed * 10_000_000 + round_ * args.round_episodes
        tasks = [EpisodeTask("train", first + i) for i in range(args.round_episodes)]
        model.eval()
        with torch.no_grad():
            run_episodes(lambda: make_env(env), tasks, player, loop, batch_size=32)
        model.train()
        relabelled += player.samples
        labelled_turns += len(player.samples)
        # One cosine over the arm's time, each round training its slice of it (after its roll-out).
        begin = (time.monotonic() - clock) / args.seconds
        end = (round_ + 1) / args.rounds
        if end > begin:
            steps += train(model, optimizer, sampler([bot, relabelled], args.batch, rng),
                           (end - begin) * args.seconds, args.lr, (begin, end))
        if args.save_rounds:
            model.save_pretrained(f"{args.save_rounds}/round_{round_ + 1}")
            print(f"dagger: round {round_ + 1} saved at {time.monotonic() - clock:.0f} s, {steps} steps, "
                  f"{labelled_turns} relabelled turns", flush=True)
    result = evaluate(model, tokenizer, loop, env, args.eval_tasks, args.eval_split)
    print(f"dagger: {steps} steps, {labelled_turns} relabelled turns, {result}", flush=True)
    return result


if __name__ == "__main__":
    main()
