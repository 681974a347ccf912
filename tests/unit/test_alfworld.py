"""ALFWorld as a TextEnv: splits and their filter, rebuilt games, admissible-command checks, the expert (no Ray)."""

import json
from collections import Counter

import pytest

from actors.agent_loop import EpisodeTask, LoopConfig, run_episodes
from actors.expert import ExpertPolicy
from envs.protocol import ToolCall
from envs.registry import make_env, parse_env_config

pytestmark = pytest.mark.alfworld

# ALFWorld's published evaluation sets after its filter (no movable/sliced tasks, solvable games).
VALID_SEEN = {"pick_and_place_simple": 35, "look_at_obj_in_light": 13, "pick_clean_then_place_in_recep": 27,
              "pick_heat_then_place_in_recep": 16, "pick_cool_then_place_in_recep": 25, "pick_two_obj_and_place": 24}
VALID_UNSEEN = {"pick_and_place_simple": 24, "look_at_obj_in_light": 18, "pick_clean_then_place_in_recep": 31,
                "pick_heat_then_place_in_recep": 23, "pick_cool_then_place_in_recep": 21, "pick_two_obj_and_place": 17}


@pytest.fixture(scope="module")
def env(alfworld_data):
    return make_env(parse_env_config({"name": "alfworld", "data_dir": str(alfworld_data)}))


def test_the_evaluation_splits_are_the_standard_140_and_134_games(env):
    from envs.alfworld.env import split_games

    assert set(env.splits) == {"valid_seen", "valid_unseen", "valid_train"}
    for split, expected in (("valid_seen", VALID_SEEN), ("valid_unseen", VALID_UNSEEN)):
        games = split_games(env.root, split, env.task_types)
        assert Counter(task_type for _, task_type in games) == expected
    assert env.split_size("valid_train") > 100
    with pytest.raises(ValueError, match="no split 'train'"):
        env.reset(0, "train")


@pytest.mark.parametrize("split", ["valid_seen", "valid_unseen", "valid_train"])
def test_reset_and_step_with_admissible_commands_checked(env, split):
    for seed in (0, 7):
        reset = env.reset(seed, split)
        assert reset.task and "Admissible commands: " in reset.observation and "Your task" not in reset.observation
        assert reset.info.split == split and reset.info.max_steps == 50
        admissible = env.admissible
        go = next(c for c in admissible if c.startswith("go to "))
        bad = env.step(ToolCall("act", {"command": "take the moon from the sky"}))
        assert bad.observation.startswith("Not admissible here: 'take the moon from the sky'.")
        assert bad.num_steps == 1 and not bad.done and env.admissible == admissible  # nothing happened
        moved = env.step(ToolCall("act", {"command": f"  {go} "}))  # spacing is normalised
        assert moved.num_steps == 2 and not moved.observation.startswith("Not admissible")
        assert env.admissible != admissible or "arrive" in moved.observation
    # The same (split, seed) is the same game.
    assert env.reset(7, split).task == reset.task


def test_a_new_games_reset_translates_its_problem_once_per_option_and_a_repeat_not_at_all(env):
    """textworld asks fast_downward for the same two translations in `load` and again in `reset`
    (benchmarks/alfworld_reset.py: the shipped reset takes twice as long)."""
    import fast_downward

    env.reset(2, "valid_seen")
    before = fast_downward.pddl2sas.cache_info()
    env.reset(3, "valid_seen")
    after = fast_downward.pddl2sas.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (2, 2)
    env.reset(3, "valid_seen")  # the same game again: its translations were kept
    again = fast_downward.pddl2sas.cache_info()
    assert (again.misses - after.misses, again.hits - after.hits) == (0, 4)


def test_the_step_limit_truncates_and_the_task_is_only_won_by_the_game(alfworld_data):
    env = make_env(parse_env_config({"name": "alfworld", "data_dir": str(alfworld_data), "max_steps": 3,
                                     "show_admissible": False}))
    reset = env.reset(1, "valid_seen")
    assert "Admissible" not in reset.observation
    steps = [env.step(ToolCall("act", {"command": "look"})) for _ in range(3)]
    assert [s.done for s in steps] == [False, False, True] and steps[-1].truncated and not steps[-1].success
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step(ToolCall("act", {"command": "look"}))


def test_old_games_are_rebuilt_once_with_the_packages_domain_and_keep_their_task(env):
    from alfworld.info import ALFRED_PDDL_PATH

    from envs.alfworld.env import playable_game, split_games

    trial, _ = split_games(env.root, "valid_unseen", env.task_types)[3]
    original = json.loads((trial / "game.tw-pddl").read_text())
    path = playable_game(trial, env.cache)
    rebuilt = json.loads(path.read_text())
    with open(ALFRED_PDDL_PATH) as f:
        assert rebuilt["pddl_domain"] == f.read() != original["pddl_domain"]
    assert rebuilt["pddl_problem"] == original["pddl_problem"] and rebuilt["solvable"]
    task = original["grammar"].split("Your task is to: ")[1].split('"')[0]
    assert f"Your task is to: {task}" in rebuilt["grammar"] and "UNKNOWN GOAL" not in rebuilt["grammar"]
    assert (path.parent / "traj_data.json").is_file()
    mtime = path.stat().st_mtime_ns
    assert playable_game(trial, env.cache) == path and path.stat().st_mtime_ns == mtime
    assert playable_game(path.parent, env.cache) == path  # a game built with the package's domain is used as is


def test_the_packages_expert_wins_through_the_agent_loop(alfworld_data):
    config = parse_env_config({"name": "alfworld", "data_dir": str(alfworld_data)})
    tasks = [EpisodeTask(split, seed) for split in ("valid_seen", "valid_unseen") for seed in range(3)]
    results = run_episodes(lambda: make_env(config), tasks, ExpertPolicy(), LoopConfig(max_turns=50), batch_size=3)
    assert sum(r.success for r in results) >= 5 and all(r.num_format_errors == 0 for r in results)


def test_gentle_format_recovers_the_admissible_command_an_unparsable_response_names_last():
    from envs.parser import recover_command

    admissible = ["go to shelf 1", "go to shelf 10", "take apple 1 from countertop 1", "look"]
    assert recover_command("I should <tool_call>{act: Go to  Shelf 10}", admissible) == "go to shelf 10"
    assert recover_command("take apple 1 from countertop 1, then go to shelf 1.", admissible) == "go to shelf 1"
    assert recover_command("look first, then take apple 1 from countertop 1", admissible) == \
        "take apple 1 from countertop 1"
    assert recover_command("nothing admissible here: go to shelf 7", admissible) is None
    assert recover_command("go to shelf 1 " + "blah " * 40, admissible) is None  # not in the last 30 words


def test_a_gentle_episode_acts_on_the_command_a_malformed_turn_names(alfworld_data):
    """Through the agent loop: a response that is no tool call at all still acts (the admissible
    command it names), is a format error, and costs the gentle step penalty."""
    from actors.agent_loop import Response
    from envs.rewards import RewardConfig

    env = make_env(parse_env_config({"name": "alfworld", "data_dir": str(alfworld_data), "max_steps": 1}))
    env.reset(0, "valid_seen")
    command = next(c for c in env.admissible if c.startswith("go to"))
    executed, step = [], env.step
    env.step = lambda call: executed.append(call) or step(call)

    class Sloppy:  # prose that names the command, and no tool call
        def respond(self, episodes):
            return [Response(f"<think>the target is there</think> I will {command}") for _ in episodes]

    loop = LoopConfig(max_turns=1, parser_mode="gentle", rewards=RewardConfig.gentle())
    (result,) = run_episodes(lambda: env, [EpisodeTask("valid_seen", 0)], Sloppy(), loop)
    assert executed == [ToolCall("act", {"command": command})]
    assert result.num_format_errors == 1 and result.reward.per_turn == (-0.1,)


def test_a_missing_data_directory_is_a_clear_config_error(tmp_path, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(ValueError, match=r"\$ALFWORLD_DATA is empty"):
        make_env(parse_env_config({"name": "alfworld"}))
    with pytest.raises(ValueError, match="has no json_2.1.1"):
        make_env(parse_env_config({"name": "alfworld", "data_dir": str(tmp_path)}))
    with pytest.raises(ValueError, match="unknown ALFWorld task type"):
        parse_env_config({"name": "alfworld", "task_types": ["cook_dinner"]})
