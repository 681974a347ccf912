"""How fast a student from scratch learns to choose the bot's action, by prompt layout.

Behaviour cloning alone, offline: the bot's episodes of a BabyAI-Text level rendered as the
agent loop renders them (`actors.expert.DemonstrationPolicy`), one sample per turn, SFT on the
response tokens for a fixed wall-clock budget per arm; the measure is the accuracy of the
tool-name token (the one token of a response the format does not fix) on the turns of unseen
bot episodes, greedy. Arms (same student, data seeds, batch and budget):

- `system_view`: the system message (rules and compact tool list) and the current view;
- `view`: the current view only, no system message (`prompt.system_message: false`);
- `history`: no system message, the whole episode's history.

Whether the student binds the instruction's words to the object it faces is measured off the
bot's path: on the turns of DART demonstrations (noise 0.3, actors.expert.DemonstrationPolicy)
where a pick_up task's agent has an object right in front, how often it would pick up when that
object is the one named and when it is another (the bot: always, never). `--noise` trains on
such demonstrations instead of the bot's own; `--oversample-facing K` repeats every training turn
of a pick_up task facing an object K times (a diagnostic: is the choice learnable at all?);
`--ask-facing` adds an objective on the comparison itself: for each such turn, its prompt with a
question ("Is the object in front of you the one your task names?") answered `right` or `other`
(RESULT keys `answers_facing_target_<arm>`, `answers_facing_other_<arm>`: how often the student
answers it right on the off-path turns); `--ask-only` trains on those questions alone.
The `nearest` arm is `view` with the observation's sentences nearest first
(`env.observation_order: nearest`): the object in front is always the first one; `memory` is
`nearest` with the objects seen earlier and out of view now after them (`env.observation_memory`).

    python benchmarks/clone_probe.py [--seconds 240] [--preset mini] [--room-size 6] [--distractors 2]
        [--task-types go_to,pick_up] [--arms system_view,view,history,nearest,memory] [--noise 0] [--oversample-facing 1]
        [--ask-facing | --ask-only]

Ends with `RESULT held_acc_<arm>=... held_acc_act_<arm>=... steps_<arm>=...
pick_up_facing_target_<arm>=... pick_up_facing_other_<arm>=... majority=...` (act: the turns where
the bot picks up, drops or toggles, the decisions that name an object; majority: the most frequent
bot action's share of the held-out turns, what a student ignoring the view can reach).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import time
from collections import Counter

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from transformers import AutoModelForCausalLM

from actors.agent_loop import EpisodeTask, LoopConfig
from actors.expert import demonstrations
from envs.babyai_text import BabyAITextConfig
from envs.parser import format_tool_call
from envs.protocol import ToolCall
from envs.registry import make_env
from models.loading import ModelConfig, load_tokenizer
from models.tiny import tiny_model_dir

_VIEW = {"history_window": 0, "tools": "compact", "system_message": False}
ARMS = {  # arm: (prompt options, environment options)
    "system_view": ({"history_window": 0, "tools": "compact"}, {}),
    "view": (_VIEW, {}),
    "history": ({**_VIEW, "history_window": "all"}, {}),
    "nearest": (_VIEW, {"observation_order": "nearest"}),
    "memory": (_VIEW, {"observation_order": "nearest", "observation_memory": True}),
}
Sample = tuple[tuple[int, ...], tuple[int, ...]]
INTERACTIONS = ("pick_up", "drop", "toggle")


def bot_turns(tokenizer, loop: LoopConfig, env: BabyAITextConfig, first_seed: int, num_episodes: int,
              noise: float = 0.0) -> list[Sample]:
    """The turns of the bot's demonstrations (`noise`: DART's, actors.expert.DemonstrationPolicy)."""
    tasks = [EpisodeTask("train", first_seed + i) for i in range(num_episodes)]
    trajectories = demonstrations(lambda: make_env(env), tasks, tokenizer, loop, noise, seed=first_seed)
    return [(t.prompt_ids, t.response_ids) for trajectory in trajectories for t in trajectory.turns]


def name_position(tokenizer) -> int:
    """Index of the tool-name token in a canonical response (where two calls first differ)."""
    a, b = (tokenizer.encode(format_tool_call(ToolCall(name)), add_special_tokens=False)
            for name in ("turn_left", "go_forward"))
    return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)


def padded(samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input ids, attention mask and labels (-100 off the response), each [N, longest]."""
    longest = max(len(p) + len(r) for p, r in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    mask = torch.zeros_like(ids)
    for i, (prompt, response) in enumerate(samples):
        n = len(prompt) + len(response)
        ids[i, :n] = torch.tensor(prompt + response)
        mask[i, :n] = 1
        labels[i, len(prompt):n] = torch.tensor(response)
    return ids, mask, labels


def sft_step(model, optimizer, samples: list[Sample]) -> None:
    """One optimizer step of cross-entropy on the samples' response tokens."""
    ids, mask, labels = padded(samples)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


@torch.no_grad()
def predicted(model, samples: list[Sample], position: int) -> list[int]:
    """Per sample: the greedy tool-name token."""
    model.eval()
    tokens = []
    for i in range(0, len(samples), 32):
        chunk = samples[i:i + 32]
        ids, mask, _ = padded(chunk)
        logits = model(input_ids=ids, attention_mask=mask).logits
        tokens += [int(logits[j, len(p) + position - 1].argmax()) for j, (p, _) in enumerate(chunk)]
    model.train()
    return tokens


_PICK_UP_TASK = re.compile(r"Your task: pick up (?:the|a) (?:(\w+) )?(\w+)\n")
_FACED = re.compile(r"\nYou see an? (\w+) (\w+) 1 step forward(?:\n|<)")


def facing(tokenizer, samples: list[Sample]) -> list[bool | None]:
    """Per turn of a pick_up task with an object right in front of the agent: whether that object
    is one the instruction names (colour, if named, and type); None for every other turn."""
    marks = []
    for prompt, _ in samples:
        text = tokenizer.decode(prompt)
        task, faced = _PICK_UP_TASK.search(text), _FACED.search(text)
        if task is None or faced is None:
            marks.append(None)
            continue
        colour, kind = task.groups()
        marks.append(faced.group(2) == kind and colour in (None, faced.group(1)))
    return marks


QUESTION = "\nIs the object in front of you the one your task names?"
ANSWERS = {True: "right", False: "other"}
"""One token each in the tiny tokenizer."""


def asked(tokenizer, samples: list[Sample], marks: list[bool | None]) -> list[tuple[Sample, bool]]:
    """For each turn facing an object, the auxiliary question of whether it is the named one with
    its answer (the turn's prompt with QUESTION ending its user message), and that mark."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    turn_end = tuple(tokenizer.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False))
    question = tuple(tokenizer.encode(QUESTION, add_special_tokens=False))
    out = []
    for (prompt, _), mark in zip(samples, marks):
        if mark is None:
            continue
        assert prompt[-len(turn_end):] == turn_end
        answer = tuple(tokenizer.encode(ANSWERS[mark], add_special_tokens=False)) + (end,)
        out.append(((prompt[:-len(turn_end)] + question + turn_end, answer), mark))
    return out


def probe(args, arm: str) -> dict[str, float]:
    """After `args.seconds` of SFT: held-out accuracy (all turns, the interaction turns), the steps
    taken, the majority share, and on the off-path turns of a pick_up task facing an object how
    often the student and the bot pick up, the object named or not."""
    tokenizer = load_tokenizer(ModelConfig(path=f"tiny:{args.preset}"))
    prompt, env_options = ARMS[arm]
    loop = LoopConfig(max_turns=20, prompt=prompt)
    env = BabyAITextConfig(room_size=args.room_size, num_distractors=args.distractors,
                           task_types=tuple(args.task_types.split(",")), expert_deviation="replan", **env_options)
    train = bot_turns(tokenizer, loop, env, 500_000_000, args.train_episodes, args.noise)
    # A diagnostic, not a method: can the student learn the choice at all when the turns facing an
    # object make up more of its data?
    marks = facing(tokenizer, train)
    extra = [sample for sample, mark in zip(train, marks) if mark is not None
             for _ in range(args.oversample_facing - 1)]
    if args.ask_facing or args.ask_only:
        # An objective on the comparison itself: answer whether the object in front is the named
        # one; the rarer answer repeated to balance the two.
        questions = asked(tokenizer, train, marks)
        other = [q for q, named in questions if not named]
        extra += [q for q, _ in questions] + other * (round(len(questions) / max(len(other), 1)) - 2)
    # --ask-only: is the comparison learnable at all, with nothing else to learn?
    train = extra if args.ask_only else train + extra
    held = bot_turns(tokenizer, loop, env, 600_000_000, args.held_episodes)
    # Off the bot's path (DART's noise, 0.3) a pick_up task's agent often faces an object the
    # instruction does not name, a state the bot's own episodes hardly show.
    off_path = bot_turns(tokenizer, loop, env, 650_000_000, 8 * args.held_episodes, 0.3)
    position = name_position(tokenizer)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(args.preset))
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    rng, order, steps, start = random.Random(0), [], 0, time.monotonic()
    while time.monotonic() - start < args.seconds:
        if not order:
            order = list(range(len(train)))
            rng.shuffle(order)
        batch, order = order[:args.batch], order[args.batch:]
        sft_step(model, optimizer, [train[i] for i in batch])
        steps += 1
    hits = [token == r[position] for token, (_, r) in zip(predicted(model, held, position), held)]
    acts = {tokenizer.encode(format_tool_call(ToolCall(name)), add_special_tokens=False)[position]
            for name in INTERACTIONS}
    act_hits = [hit for hit, (_, r) in zip(hits, held) if r[position] in acts]
    pick_up = tokenizer.encode(format_tool_call(ToolCall("pick_up")), add_special_tokens=False)[position]
    marks = facing(tokenizer, off_path)
    student = predicted(model, off_path, position)
    rates = {}
    for named, key in ((True, "target"), (False, "other")):
        turns = [i for i, mark in enumerate(marks) if mark is named]
        rates[f"pick_up_facing_{key}"] = sum(student[i] == pick_up for i in turns) / max(len(turns), 1)
        rates[f"bot_pick_up_facing_{key}"] = (sum(off_path[i][1][position] == pick_up for i in turns)
                                              / max(len(turns), 1))
        rates[f"turns_facing_{key}"] = len(turns)
    if args.ask_facing or args.ask_only:
        questions = asked(tokenizer, off_path, marks)
        answers = predicted(model, [q for q, _ in questions], 0)
        for named, key in ((True, "target"), (False, "other")):
            right = tokenizer.encode(ANSWERS[named], add_special_tokens=False)[0]
            given = [answer for answer, (_, mark) in zip(answers, questions) if mark is named]
            rates[f"answers_facing_{key}"] = sum(answer == right for answer in given) / max(len(given), 1)
        print(f"answers the question right facing the named object {rates['answers_facing_target']:.2f}, "
              f"facing another {rates['answers_facing_other']:.2f}", flush=True)
    result = {"held_acc": sum(hits) / len(hits), "held_acc_act": sum(act_hits) / max(len(act_hits), 1),
              "steps": steps, "majority": max(Counter(r[position] for _, r in held).values()) / len(held), **rates}
    tokens = sum(len(p) + len(r) for p, r in train) / len(train)
    print(f"{arm:<12} {tokens:>7.0f} tokens/turn {steps:>6} steps  held-out accuracy {result['held_acc']:.3f} "
          f"({result['held_acc_act']:.3f} on {len(act_hits)} interaction turns); picks up facing the named "
          f"object {rates['pick_up_facing_target']:.2f} ({rates['turns_facing_target']} turns), facing another "
          f"{rates['pick_up_facing_other']:.2f} ({rates['turns_facing_other']}); the bot "
          f"{rates['bot_pick_up_facing_target']:.2f}, {rates['bot_pick_up_facing_other']:.2f}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=240.0, help="SFT wall clock per arm")
    parser.add_argument("--preset", default="mini")
    parser.add_argument("--room-size", type=int, default=6)
    parser.add_argument("--distractors", type=int, default=2)
    parser.add_argument("--task-types", default="go_to,pick_up", help="comma-separated")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--train-episodes", type=int, default=2048)
    parser.add_argument("--held-episodes", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16, help="turns per step")
    parser.add_argument("--lr", type=float, default=0.002)
    parser.add_argument("--noise", type=float, default=0.0,
                        help="train on DART's demonstrations with this noise")
    parser.add_argument("--oversample-facing", type=int, default=1,
                        help="copies of each training turn of a pick_up task facing an object")
    parser.add_argument("--ask-facing", action="store_true",
                        help="add the question whether the object in front is the named one to the training turns")
    parser.add_argument("--ask-only", action="store_true",
                        help="train on those questions alone (is the comparison learnable at all?)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    arms = args.arms.split(",")
    if unknown := set(arms) - set(ARMS):
        raise ValueError(f"unknown arms {sorted(unknown)}; known: {list(ARMS)}")
    results = {arm: probe(args, arm) for arm in arms}
    majority = next(iter(results.values()))["majority"]  # the same bot episodes in every arm: only the prompt differs
    keys = ("held_acc", "held_acc_act", "steps", "pick_up_facing_target", "pick_up_facing_other",
            *(("answers_facing_target", "answers_facing_other") if args.ask_facing or args.ask_only else ()))
    print("RESULT " + " ".join(f"{key}_{arm}={r[key]}" if key == "steps" else f"{key}_{arm}={r[key]:.3f}"
                               for arm, r in results.items() for key in keys) + f" majority={majority:.3f}")


if __name__ == "__main__":
    main()
