"""ScienceWorld as a TextEnv, against the simulator itself (its JVM, no Ray): the simulator's own
splits, observations as it writes them, unknown commands, the gold-path expert, the score."""

import pytest

from actors.agent_loop import EpisodeTask, LoopConfig, run_episodes
from actors.expert import ExpertPolicy
from envs.protocol import ToolCall
from envs.registry import make_env, parse_env_config
from envs.rewards import RewardConfig

pytestmark = pytest.mark.scienceworld


@pytest.fixture(scope="module")
def env(scienceworld_ready):
    env = make_env(parse_env_config({"name": "scienceworld"}))
    yield env
    env.close()


@pytest.fixture(scope="module")
def raw(scienceworld_ready):
    """The package's simulator, driven directly: the reference for what the agent must see."""
    from scienceworld import ScienceWorldEnv

    sim = ScienceWorldEnv("", envStepLimit=1000)
    yield sim
    sim.close()


def act(command: str) -> ToolCall:
    return ToolCall("act", {"command": command})


def test_splits_are_the_simulators_own(raw):
    from envs.scienceworld import SPLITS, TASK_TYPES, split_tasks, variations

    assert list(TASK_TYPES) == list(raw.get_task_names())
    for task_type in TASK_TYPES:
        raw.load(task_type, 0, "")
        assert list(variations(task_type, "train")) == list(raw.get_variations_train()), task_type
        assert list(variations(task_type, "dev")) == list(raw.get_variations_dev()), task_type
        assert list(variations(task_type, "test")) == list(raw.get_variations_test()), task_type
    assert [len(split_tasks(s, TASK_TYPES)) for s in SPLITS] == [3592, 1796, 1819]
    first = split_tasks("dev", TASK_TYPES)[:len(TASK_TYPES)]  # round-robin: any prefix covers the types
    assert [t for t, _ in first] == list(TASK_TYPES) and first[0] == ("boil", 14)
    assert len(set(split_tasks("test", TASK_TYPES))) == 1819


@pytest.mark.parametrize("split,seed", [("dev", 0), ("test", 7), ("train", 40)])
def test_observations_are_the_simulators_text_with_the_actions(env, raw, split, seed):
    from envs.scienceworld import TASK_TYPES, split_tasks

    task_type, variation = split_tasks(split, TASK_TYPES)[seed]
    reset = env.reset(seed, split)
    raw.load(task_type, variation, "easy")
    look, _ = raw.reset()
    assert (reset.info.task_type, reset.info.split, reset.info.max_steps) == (task_type, split, 30)
    assert reset.task == raw.get_task_description().strip()
    text, actions, objects = reset.observation.split("\n")[:-2], *reset.observation.split("\n")[-2:]
    # Two JVMs may list a container's contents in another order (Java's identity hashes): the
    # same lines, not always in the same order.
    assert sorted(text) == sorted(look.strip().split("\n"))
    templates = [t for t in raw.get_possible_actions() if t not in ("reset task", "wait1")]
    assert actions == f"Actions (OBJ: an object): {', '.join(templates)}"
    assert objects.startswith("Objects: ") and \
        sorted(objects.removeprefix("Objects: ").split(", ")) == sorted(raw.get_possible_objects())
    step = env.step(act("look around"))
    answer, _, _, info = raw.step("look around")
    said = step.observation.split("\nActions (OBJ: an object): ")[0]
    assert sorted(said.split("\n")) == sorted(answer.strip().split("\n"))
    assert (step.num_steps, step.done, step.success, step.score) == (1, False, False, info["score"] / 100)
    assert env.step(act("")).score == step.score  # a refused command keeps the score reached


def test_unknown_empty_and_reset_commands_cost_a_step_with_a_message(env):
    env.reset(1, "dev")
    first = env.step(act("fly to the moon"))
    assert first.observation.startswith("No known action matches 'fly to the moon'. Use one of the actions below.")
    assert env.step(act("   ")).observation.startswith("The command is empty.")
    assert env.step(act("reset task")).observation.startswith("'reset task' is not available")
    last = env.step(act("look around"))
    assert last.num_steps == 4 and not last.done and "This room is called" in last.observation
    with pytest.raises(ValueError, match="unknown tool 'go'"):
        env.step(ToolCall("go", {}))


def test_the_step_limit_truncates_and_the_valid_command_listing(scienceworld_ready):
    env = make_env(parse_env_config({"name": "scienceworld", "max_steps": 2, "show_actions": "valid",
                                     "max_valid_actions": 5}))
    try:
        reset = env.reset(0, "dev")
        listed = reset.observation.split("\nValid commands: ")[1]
        shown, more = listed.split(" (and ")
        assert len(shown.split(", ")) == 5 and more.endswith(" more)")
        env.step(act("look around"))
        last = env.step(act("look around"))
        assert last.done and last.truncated and not last.success
        with pytest.raises(RuntimeError, match="episode is over"):
            env.step(act("look around"))
    finally:
        env.close()


def test_an_episode_is_the_same_on_every_replay_but_for_the_order_of_listed_contents(env):
    """The simulator lists a container's contents in hash order, which changes between resets:
    the same world and answers, the lines not always in the same order."""
    commands = ["look around", "open door to hallway", "go to hallway", "look around", "focus on air"]
    plays = []
    for _ in range(2):
        observations = [env.reset(5, "test").observation]
        steps = [env.step(act(c)) for c in commands]
        observations += [s.observation for s in steps]
        plays.append(([sorted(o.split("\n")) for o in observations], [(s.done, s.score) for s in steps]))
    assert plays[0] == plays[1]


@pytest.mark.parametrize("task_type", ["find-non-living-thing", "lifespan-longest-lived", "use-thermometer"])
def test_the_gold_path_expert_solves_short_tasks_and_scores_one(env, task_type):
    from envs.scienceworld import TASK_TYPES

    seed = TASK_TYPES.index(task_type)  # the first dev variation of that type
    results = run_episodes(lambda: env, [EpisodeTask("dev", seed)], ExpertPolicy(), LoopConfig(max_turns=30))
    assert results[0].info.task_type == task_type and results[0].success
    assert results[0].reward.outcome == RewardConfig().success_reward


def test_the_expert_repeats_its_advice_after_a_detour_and_needs_a_fresh_reset(env):
    env.reset(2, "dev")
    expert = env.expert()
    first = expert.act(None)
    assert first == act(expert.gold[0])
    assert expert.act(act("look around")) == first  # a detour: same advice
    assert expert.act(first) == act(expert.gold[1])  # followed: the next step
    env.reset(3, "dev")
    env.step(act("look around"))
    with pytest.raises(RuntimeError, match="right after reset"):
        env.expert()  # the gold path of a task not asked for before needs a reload
    env.reset(2, "dev")
    env.step(act("look around"))
    assert env.expert().gold == expert.gold  # kept from the first time


def test_a_failed_task_scores_zero_and_partial_progress_moves_the_outcome(env):
    from envs.rewards import episode_reward

    env.reset(0, "dev")  # boil: focusing on the wrong substance fails the task at once
    failed = env.step(act("focus on air"))
    assert failed.done and not failed.success and failed.score == 0.0
    assert episode_reward(RewardConfig(), False, [True], score=0.25).outcome == pytest.approx(-0.5)


def test_recover_names_the_valid_command_in_the_tail(env):
    env.reset(0, "dev")
    assert env.recover("I think I should open the cupboard, no: go to hallway now!") == act("go to hallway")
    assert env.recover("no command here") is None


def test_unknown_task_types_are_a_config_error():
    with pytest.raises(ValueError, match=r"unknown ScienceWorld task type\(s\) \['boil-egg'\]"):
        parse_env_config({"name": "scienceworld", "task_types": ["boil-egg"]})
