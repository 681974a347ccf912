"""Failure modes of BabyAI-Text episodes, read by replaying their executed calls."""

import json
from types import SimpleNamespace

from minigrid.envs.babyai.core.verifier import GoToInstr, ObjDesc, PickupInstr
from minigrid.utils.baby_ai_bot import BabyAIBot

from envs.babyai_text import TASK_TYPES, BabyAITextConfig, BabyAITextEnv
from envs.babyai_text.diagnosis import FAILURE_MODES
from envs.babyai_text.env import ACTION_TO_TOOL
from envs.protocol import ToolCall
from tests.unit.test_babyai_env import seeds_of_type

SMALL = BabyAITextConfig(room_size=6, num_distractors=3)


def expert_calls(env, seed, task_type_steps=128):
    env.reset(seed, "train")
    expert, calls = env.expert(), []
    for _ in range(task_type_steps):
        calls.append(expert.act(calls[-1] if calls else None))
        if env.step(calls[-1]).done:
            return calls
    raise AssertionError("the bot did not finish")


def test_the_bots_episodes_succeed_on_replay():
    env = BabyAITextEnv()
    for task_type in TASK_TYPES:
        for seed in seeds_of_type(task_type, 3):
            assert env.failure_mode("train", seed, expert_calls(env, seed)) is None, (task_type, seed)
    assert set(FAILURE_MODES) == {"format", "navigation", "object_choice", "interaction", "sequencing"}


def test_half_the_turns_unparsed_is_a_format_failure():
    env = BabyAITextEnv()
    seed = seeds_of_type("go_to", 1)[0]
    assert env.failure_mode("train", seed, [None] * 5 + [ToolCall("turn_left")] * 5) == "format"
    assert env.failure_mode("train", seed, [None] * 4 + [ToolCall("turn_left")] * 5) != "format"


def test_stopping_in_front_of_the_object_without_picking_it_up_is_interaction():
    env = BabyAITextEnv(SMALL)
    for seed in seeds_of_type("pick_up", 3):
        calls = expert_calls(env, seed)
        assert calls[-1] == ToolCall("pick_up")
        assert env.failure_mode("train", seed, calls[:-1] + [ToolCall("turn_left")]) == "interaction"


def test_the_first_part_done_and_not_the_second_is_sequencing():
    env = BabyAITextEnv(SMALL)
    for task_type in ("put_next_to", "pick_up_then_go_to", "open"):
        # A task whose first pick-up does not also end it (B right behind A).
        seed, calls = next((seed, calls) for seed in seeds_of_type(task_type, 10)
                           if (calls := expert_calls(env, seed)).index(ToolCall("pick_up")) < len(calls) - 1)
        first_pick = calls.index(ToolCall("pick_up"))
        assert env.failure_mode("train", seed, calls[:first_pick + 1]) == "sequencing", task_type
        assert env.failure_mode("train", seed, calls[:first_pick]) != "sequencing", task_type


def test_picking_up_another_object_is_object_choice():
    env = BabyAITextEnv(SMALL)
    for task_type in ("pick_up", "put_next_to"):
        for seed in seeds_of_type(task_type, 3):
            env.reset(seed, "train")
            level = env.level
            target = level.instrs.desc if task_type == "pick_up" else level.instrs.desc_move
            wrong = next(o for o in level.grid.grid if o is not None and o.type in ("key", "ball", "box")
                         and (o.type, o.color) != (target.type, target.color))
            real, level.instrs = level.instrs, PickupInstr(ObjDesc(wrong.type, wrong.color))
            level.instrs.reset_verifier(level)
            bot, level.instrs = BabyAIBot(level), real
            calls, action = [], None
            while level.carrying is None:
                action = bot.replan(action)
                calls.append(ToolCall(ACTION_TO_TOOL[int(action)]))
                env.step(calls[-1])
            assert env.failure_mode("train", seed, calls + [ToolCall("turn_left")]) == "object_choice"


def test_go_to_standing_at_a_lookalike_is_object_choice_and_turning_in_place_is_navigation():
    env = BabyAITextEnv(SMALL)
    turn, forward = ToolCall("turn_left"), ToolCall("go_forward")
    checked = 0
    for seed in seeds_of_type("go_to", 10):
        env.reset(seed, "train")
        level = env.level
        targets = level.instrs.desc.obj_set
        lookalike = next((o for o in level.grid.grid if o is not None and o.type in ("key", "ball", "box")
                          and all((o.type, o.color) != (t.type, t.color) and (o.type == t.type or o.color == t.color)
                                  for t in targets)), None)
        # minigrid places no object next to the agent's start: turning in place faces none.
        assert env.failure_mode("train", seed, [turn] * 8) == "navigation"
        if lookalike is None:
            continue
        real, level.instrs = level.instrs, GoToInstr(ObjDesc(lookalike.type, lookalike.color))
        level.instrs.reset_verifier(level)
        bot, level.instrs = BabyAIBot(level), real
        calls, action, passed_by = [], bot.replan(None), False
        while action != level.actions.done and not passed_by:  # until it faces an object like `lookalike`
            calls.append(ToolCall(ACTION_TO_TOOL[int(action)]))
            passed_by = env.step(calls[-1]).success  # its way went by the target
            action = bot.replan(action)
        if passed_by:
            continue
        # Walking into it keeps facing it: it stopped at the wrong object; passing by is navigation.
        assert env.failure_mode("train", seed, calls + [forward]) == "object_choice"
        assert env.failure_mode("train", seed, calls + [turn]) == "navigation"
        checked += 1
    assert checked >= 3


def _episode(calls_and_answers, success=False, stages=None, seed=0):
    turns = [SimpleNamespace(executed_call=None if c is None else json.dumps({"name": c, "arguments": {}}),
                             response_ids=(a,), stage=(stages or {}).get(i, "action"))
             for i, (c, a) in enumerate(calls_and_answers)]
    return SimpleNamespace(success=success, trajectory=SimpleNamespace(turns=turns),
                           info=SimpleNamespace(seed=seed, split="train"))


def test_a_failed_episode_that_repeats_a_view_its_last_call_and_its_answer_to_the_end_ended_in_a_cycle():
    from jobs.evaluate import cycle_period

    L, R, F = "turn_left", "turn_right", "go_forward"
    # A view, turn left, another view, turn right, the first view again: for ever after.
    assert cycle_period(_episode([(F, 7), (L, 5), (R, 6), (L, 5), (R, 6), (L, 5)]), list("abcbcb")) == 2
    assert cycle_period(_episode([(L, 7), (F, 8), (F, 8), (F, 8)]), list("abcc")) == 1  # a wall
    # A view and its answer came back once, then the episode went elsewhere: no cycle...
    assert cycle_period(_episode([(L, 5), (R, 6), (L, 5), (F, 6)]), list("abad")) is None
    assert cycle_period(_episode([(L, 5), (L, 6), (R, 6)]), list("aab")) is None  # answered otherwise (sampling)
    # ...and one that ends in a cycle after such a coincidence still counts.
    assert cycle_period(_episode([(L, 5), (R, 6), (L, 5), (F, 6), (F, 8), (F, 8), (F, 8)]),
                        list("abadeee")) == 1
    # The same view after another call is another state of a prompt that names the last call.
    assert cycle_period(_episode([(L, 5), (R, 6), (L, 5), (R, 6), (L, 5)]), list("aaaaa")) == 2
    # Periods count action turns: a working-memory turn between two equal ones is not one.
    assert cycle_period(_episode([(F, 5), (None, 9), (F, 5), (F, 5)], stages={1: "memory"}), list("aaa")) == 1
    assert cycle_period(_episode([(F, 5), (F, 5)], success=True), list("aa")) is None
    assert cycle_period(SimpleNamespace(success=False, trajectory=None), []) is None  # the bot: no token record


def test_views_are_replayed_from_the_task_through_the_executed_calls():
    from jobs.evaluate import cycle_periods, views_answered

    env = BabyAITextEnv()
    reset = env.reset(3, "train")
    lefts = _episode([("turn_left", 5)] * 12, seed=3)
    views = views_answered(env, lefts)
    assert views[0] == views[4] == views[8] == reset.observation and len(set(views)) == 4
    # The first lap starts after no call, so the cycle shows from the second on.
    assert cycle_periods(env, [lefts]) == [4]
    assert cycle_periods(env, [_episode([("turn_left", 5)] * 12, success=True, seed=3)]) == [None]
