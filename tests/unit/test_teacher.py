"""Teacher backends, the oracle distribution, privileged context, micro-batching (no Ray)."""

import asyncio
import dataclasses
import json
import math
import random

import pytest
import torch

from actors.agent_loop import EpisodeTask, LoopConfig, ModelPolicy, run_episodes
from actors.engine import SamplingConfig
from actors.expert import DemonstrationPolicy
from actors.hf_engine import HFEngine
from buffer.contracts import Trajectory, Turn
from envs.babyai_text import BabyAITextConfig, BabyAITextEnv
from envs.parser import format_tool_call
from envs.privileged import PrivilegedConfig, PrivilegedContext, Skill, load_skill_bank
from envs.prompt import PromptConfig
from envs.protocol import ToolCall
from models.loading import ModelConfig, load_model, load_tokenizer
from teacher.backends import HFTeacherBackend, ScoreRequest, TokenScores
from teacher.oracle import ExpertOracleTeacher, OracleConfig
from teacher.privileged import TeacherPromptBuilder
from teacher.service import ModelTeacher, TeacherConfig, TeacherService, build_scorer, check_same_tokenizer

NANO = ModelConfig(path="tiny:nano")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(NANO)


@pytest.fixture(scope="module")
def model():
    return load_model(NANO)


def oracle_for(tok, config: OracleConfig, env_config: BabyAITextConfig = BabyAITextConfig()) -> ExpertOracleTeacher:
    return ExpertOracleTeacher(tok, config, BabyAITextEnv(env_config))


def expert_trajectory(tok, seed, deviate_at=None, num_turns=8):
    """Bot actions as turns (optionally one wrong action), with executed calls recorded."""
    env = BabyAITextEnv()
    reset = env.reset(seed, "train")
    expert, last, turns, end = env.expert(), None, [], tok.convert_tokens_to_ids("<|im_end|>")
    for k in range(num_turns):
        action = expert.act(last)
        if k == deviate_at:
            action = ToolCall("turn_right" if action.name != "turn_right" else "turn_left")
        ids = tuple(tok.encode(format_tool_call(action), add_special_tokens=False)) + (end,)
        turns.append(Turn(k, (1, 2, 3), ids, tuple(-1.0 for _ in ids), 0,
                          executed_call=json.dumps({"name": action.name, "arguments": {}})))
        step = env.step(action)
        last = action
        if step.done:
            break
    return Trajectory(f"t{seed}", "g", "train", seed, reset.info.task_type, tuple(turns), step.success, 1.0, 0.5,
                      task=reset.task)


def test_oracle_rewards_the_bots_action_and_valid_format(tok):
    oracle = oracle_for(tok, OracleConfig(action_smoothing=0.02, token_smoothing=1e-3))
    traj = expert_trajectory(tok, seed=0)
    actions = oracle.expert_calls(traj)
    for turn, action in zip(traj.turns, actions):
        assert json.loads(turn.executed_call)["name"] == action.name
        logps = oracle.token_logprobs(turn.response_ids, action)
        assert len(logps) == len(turn.response_ids)
        assert all(lp > math.log(0.97) for lp in logps)  # following the bot costs almost nothing
    # Another valid action: only the token that picks it is expensive; the format tokens stay cheap.
    right = oracle.responses["turn_right"]
    logps = oracle.token_logprobs(right, ToolCall("turn_left"))
    cheap = [lp > math.log(0.97) for lp in logps]
    assert cheap.count(False) == 1 and math.log(0.02 / 5) - 0.1 < min(logps) < math.log(0.02 / 5) + 0.1
    # Free text leaves every valid response at its first token (log ε/V); after it the oracle has
    # no opinion (the behaviour's log-prob: zero advantage), or is uniform if so configured.
    junk = tuple(tok.encode("I am thinking about it", add_special_tokens=False))
    behaviour = tuple(-0.1 * (i + 1) for i in range(len(junk)))
    junk_lp = oracle.token_logprobs(junk, ToolCall("turn_left"), behaviour)
    assert len(junk) > 2 and junk_lp[0] == pytest.approx(math.log(1e-3 / len(tok)), abs=1e-3)
    assert junk_lp[1:] == behaviour[1:]
    with pytest.raises(ValueError, match="needs the behaviour log-probs"):
        oracle.token_logprobs(junk, ToolCall("turn_left"))
    uniform = oracle_for(tok, OracleConfig(after_divergence="uniform")).token_logprobs(junk, ToolCall("turn_left"))
    assert uniform[1:] == pytest.approx([-math.log(len(tok))] * (len(junk) - 1))
    # No bot action (mission believed done): the prior over actions is uniform, 1/6 per whole call.
    assert sum(oracle.token_logprobs(right, None)) == pytest.approx(math.log(1 / 6), abs=0.02)
    # The sequence-level probability of the bot's call is 1 - δ (up to ε).
    assert sum(oracle.token_logprobs(oracle.responses["toggle"], ToolCall("toggle"))) == pytest.approx(math.log(0.98), abs=0.02)



def test_oracle_top_k_names_the_bots_token_where_the_student_chose_another(tok):
    oracle = oracle_for(tok, OracleConfig(action_smoothing=0.02, token_smoothing=1e-3))
    right, left = oracle.responses["turn_right"], oracle.responses["turn_left"]
    decision = next(t for t, (a, b) in enumerate(zip(right, left)) if a != b)
    scores = oracle.token_scores(right, ToolCall("turn_left"), top_k=2)
    assert scores.logprobs == oracle.token_logprobs(right, ToolCall("turn_left"))
    assert len(scores.topk_ids) == len(right) and {len(row) for row in scores.topk_ids} == {2}
    # Before the decision every valid call agrees: one candidate, the format token, padded with -1.
    assert all(scores.topk_ids[t] == (right[t], -1) for t in range(decision))
    # At the decision the bot's token leads with 1 - δ of the mass; another action's token follows.
    assert scores.topk_ids[decision][0] == left[decision]
    assert scores.topk_logprobs[decision][0] == pytest.approx(math.log(0.98 * (1 - 1e-3) + 1e-3 / len(tok)))
    assert scores.topk_ids[decision][1] not in (left[decision], -1)
    # After the student's choice only its own call is followed.
    assert all(scores.topk_ids[t] == (right[t], -1) for t in range(decision + 1, len(right)))
    # Free text: no candidates once the response left every valid call.
    junk = tuple(tok.encode("I am thinking about it", add_special_tokens=False))
    junk_scores = oracle.token_scores(junk, ToolCall("turn_left"), tuple(-1.0 for _ in junk), top_k=2)
    assert all(row == (-1, -1) for row in junk_scores.topk_ids[1:])

def test_oracle_replays_executed_calls_and_advises_after_a_deviation(tok):
    oracle = oracle_for(tok, OracleConfig())
    straight = expert_trajectory(tok, seed=0)
    deviated = expert_trajectory(tok, seed=0, deviate_at=2)
    a, b = oracle.expert_calls(straight), oracle.expert_calls(deviated)
    assert a[:3] == b[:3]
    # The bot saw the wrong turn and plans from the new state: it now wants to undo or re-route.
    assert b[3] is not None
    assert json.loads(deviated.turns[2].executed_call)["name"] != b[2].name


STARTER = BabyAITextConfig(room_size=6, num_distractors=1, task_types=("go_to", "pick_up"))


def student_trajectory(tok, env_config, seed, actions, task_type):
    """Turns that executed `actions`, then one more turn whose call is not executed yet."""
    end = tok.convert_tokens_to_ids("<|im_end|>")
    turns = [Turn(k, (1,), (end,), (-1.0,), 0, executed_call=json.dumps({"name": a, "arguments": {}}))
             for k, a in enumerate(actions)]
    turns.append(Turn(len(actions), (1,), (end,), (-1.0,), 0))
    return Trajectory(f"s{seed}", "g", "train", seed, task_type, tuple(turns), False, 0.0, 0.0)


@pytest.mark.parametrize("env_config", [STARTER, BabyAITextConfig()], ids=["starter", "mixed_train_local"])
def test_oracle_advice_at_states_the_student_reaches_solves_the_task(tok, env_config):
    """From a state reached by random actions (student mistakes), the oracle's most likely call
    is the bot's action re-planned from that state, and following it solves the task."""
    oracle = oracle_for(tok, OracleConfig(), env_config)
    rng = random.Random(0)
    names = list(oracle.responses)
    num_states = num_solved = 0
    for seed in range(24):
        env = BabyAITextEnv(env_config)
        reset = env.reset(seed, "train")
        actions, done = [], False
        for _ in range(rng.randint(1, 8)):
            actions.append(rng.choice(names))
            done = env.step(ToolCall(actions[-1])).done
            if done:
                break
        if done:
            continue
        num_states += 1
        for _ in range(60):
            traj = student_trajectory(tok, env_config, seed, actions, reset.info.task_type)
            advice = oracle.expert_calls(traj)[-1]
            if advice is None:
                break
            scores = {a: sum(oracle.token_logprobs(oracle.responses[a], advice)) for a in names}
            assert max(scores, key=scores.get) == advice.name
            assert scores[advice.name] > math.log(0.95)
            actions.append(advice.name)
            step = env.step(advice)
            if step.done:
                num_solved += step.success
                break
    assert num_states >= 18
    assert num_solved >= 0.9 * num_states, f"the oracle's advice solved {num_solved}/{num_states} mid-episode states"


def test_oracle_replays_the_level_the_student_played(tok):
    """The oracle must rebuild the student's level (room size, distractors, task types): with
    the default level instead, it replays a different task and its advice is wrong."""
    env = BabyAITextEnv(STARTER)
    reset = env.reset(3, "train")
    expert, last, actions = env.expert(), None, []
    for _ in range(20):
        last = expert.act(last)
        actions.append(last)
        if env.step(last).done:
            break
    traj = student_trajectory(tok, STARTER, 3, [a.name for a in actions[:-1]], reset.info.task_type)
    # The teacher service builds its oracle from the job's env section, as every other part does.
    served = build_scorer(TeacherConfig(backend="oracle"), NANO, STARTER)
    assert served.expert_calls(traj) == actions
    assert oracle_for(tok, OracleConfig()).expert_calls(traj) != actions


@pytest.mark.parametrize("deviation", ["undo", "replan"])
def test_oracle_labels_equal_a_bot_advised_live(tok, deviation):
    """DAgger's label at each state a student reached, two ways: the oracle replaying the episode
    afterwards, and a bot that played along, advised of every executed call (as
    benchmarks/dagger_probe.py labels). A turn that executed nothing leaves the bot's call standing."""
    config = BabyAITextConfig(expert_deviation=deviation)
    oracle = oracle_for(tok, OracleConfig(), config)
    rng = random.Random(1)
    names = list(oracle.responses)
    num_labels = 0
    for seed in range(12):
        env = BabyAITextEnv(config)
        reset = env.reset(seed, "train")
        bot, executed, live, actions = env.expert(), None, [], []
        for k in range(20):
            if k == 0 or executed is not None:
                suggestion = bot.act(executed)
            live.append(suggestion)
            executed = None if rng.random() < 0.1 else ToolCall(rng.choice(names))  # 0.1: a malformed turn
            actions.append(executed)
            if executed is not None and env.step(executed).done:
                break
        end = tok.convert_tokens_to_ids("<|im_end|>")
        turns = tuple(Turn(k, (1,), (end,), (-1.0,), 0, executed_call=None if a is None else json.dumps(
            {"name": a.name, "arguments": {}})) for k, a in enumerate(actions))
        traj = Trajectory(f"s{seed}", "g", "train", seed, reset.info.task_type, turns, False, 0.0, 0.0)
        assert oracle.expert_calls(traj) == live
        num_labels += len(live)
    assert num_labels > 100


def test_hf_backend_matches_a_forward_pass(tok, model):
    backend = HFTeacherBackend(model, tok.pad_token_id, max_batch_tokens=40)
    reqs = [ScoreRequest(tuple(tok.encode("You see a wall", add_special_tokens=False)),
                         tuple(tok.encode(" 2 steps forward", add_special_tokens=False))),
            ScoreRequest((5, 6, 7, 8, 9, 10, 11, 12), (13, 14)),
            ScoreRequest((3,), (4, 5, 6))]
    scores = backend.score(reqs, top_k=3)
    for r, s in zip(reqs, scores):
        ids = torch.tensor([list(r.prompt_ids) + list(r.response_ids)])
        with torch.no_grad():
            logp_all = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
        start = len(r.prompt_ids) - 1
        ref = logp_all.gather(-1, ids[0, 1:, None]).squeeze(-1)[start:]
        assert len(s.logprobs) == len(r.response_ids) and torch.allclose(torch.tensor(s.logprobs), ref, atol=1e-5)
        top = logp_all[start:].topk(3, dim=-1)
        assert s.topk_ids == tuple(map(tuple, top.indices.tolist()))
        assert torch.allclose(torch.tensor(s.topk_logprobs), top.values, atol=1e-5)
    assert all(s.topk_ids is None for s in backend.score(reqs))


SKILLS = PrivilegedConfig(skills=(Skill(keywords=("door",), text="A locked door opens with the key of its colour."),
                                   Skill(keywords=("ball",), text="Balls can be picked up.")))


@pytest.mark.parametrize("tools", ["schema", "compact"])
def test_privileged_context_changes_only_the_system_turn(tok, model, tools):
    env = BabyAITextEnv()
    prompt = PromptConfig(tools=tools)
    builder = TeacherPromptBuilder(tok, env, PrivilegedContext(SKILLS), prompt)
    loop = LoopConfig(max_turns=2, prompt=prompt)
    policy = ModelPolicy(HFEngine(model, tok.pad_token_id, [tok.convert_tokens_to_ids("<|im_end|>")]), tok,
                         SamplingConfig(max_new_tokens=8, seed=0), loop)
    traj = run_episodes(BabyAITextEnv, [EpisodeTask("train", 0)], policy, loop)[0].trajectory
    assert "door" in traj.task
    student = traj.turns[1].prompt_ids
    assert "Skills" not in tok.decode(student)  # the student never reads c+
    teacher = builder.teacher_prompt(student, traj)
    text = tok.decode(teacher)
    assert "Skills that help with this task:\n- A locked door opens" in text and "Balls" not in text
    assert tok.decode(student) == text.replace(
        "\n\nSkills that help with this task:\n- A locked door opens with the key of its colour.", "")
    other = next(t for t in (run_episodes(BabyAITextEnv, [EpisodeTask("train", s)], policy, loop)[0].trajectory
                             for s in range(1, 20)) if "door" not in t.task and "ball" not in t.task)
    assert builder.teacher_prompt(other.turns[0].prompt_ids, other) == other.turns[0].prompt_ids  # nothing retrieved
    with pytest.raises(ValueError, match="system turn"):
        builder.teacher_prompt((1, 2, 3) + student, traj)
    with pytest.raises(ValueError, match="teacher's environment"):
        builder.teacher_prompt(student, dataclasses.replace(traj, task="go to the purple ball"))
    scorer = ModelTeacher(HFTeacherBackend(model, tok.pad_token_id), builder)
    scores = scorer.score_trajectories([traj])[0]
    assert [len(s.logprobs) for s in scores] == [len(t.response_ids) for t in traj.turns]
    plain = ModelTeacher(HFTeacherBackend(model, tok.pad_token_id)).score_trajectories([traj])[0]
    assert scores != plain  # the context changed the teacher's view


@pytest.mark.parametrize("tools", ["schema", "compact"])
def test_teacher_prompts_are_the_prompts_the_teacher_was_built_on(tok, tools):
    """The service's rewrite of a student prompt is byte-identical to the prompt the teacher saw in
    its own episodes while `jobs.build_teacher` trained it (same task, same calls)."""
    privileged = SKILLS.model_copy(update={"map": True})
    prompt = PromptConfig(tools=tools)
    builder = TeacherPromptBuilder(tok, BabyAITextEnv(), PrivilegedContext(privileged), prompt)
    student_loop = LoopConfig(max_turns=5, prompt=prompt)
    teacher_loop = student_loop.model_copy(update={"privileged": privileged})
    tasks = [EpisodeTask("train", seed) for seed in range(6)]
    students = run_episodes(BabyAITextEnv, tasks, DemonstrationPolicy(tok, student_loop), student_loop)
    teachers = run_episodes(BabyAITextEnv, tasks, DemonstrationPolicy(tok, teacher_loop), teacher_loop)
    for s, t in zip(students, teachers):
        assert [turn.response_ids for turn in s.trajectory.turns] == [turn.response_ids for turn in t.trajectory.turns]
        for student_turn, teacher_turn in zip(s.trajectory.turns, t.trajectory.turns):
            assert "Map of the whole level" not in tok.decode(student_turn.prompt_ids)
            assert builder.teacher_prompt(student_turn.prompt_ids, s.trajectory) == teacher_turn.prompt_ids
    assert "Map of the whole level" in tok.decode(teachers[0].trajectory.turns[0].prompt_ids)


def test_the_map_names_every_object_relative_to_the_start_pose():
    env = BabyAITextEnv()
    reset = env.reset(3, "train")
    lines = env.privileged_map().splitlines()
    visible = [line.removeprefix("You see a ").replace(" door", " door") for line in reset.observation.splitlines()
               if line.startswith("You see a ") and "wall" not in line]
    for seen in visible:  # what the agent sees is on the map at the same place
        assert any(line.lower().endswith(seen.lower()) or line.lower() == "a " + seen.lower() for line in lines), seen
    level = env.level
    num_objects = sum(1 for c in level.grid.grid if c is not None and c.type != "wall")
    assert len([line for line in lines if not line.startswith(("Map", "A wall"))]) == num_objects
    assert {line.split(" steps ")[-1].split(" step ")[-1] for line in lines if line.startswith("A wall")} \
        == {"forward", "back", "left", "right"}


def test_skill_banks_load_from_files_and_bad_ones_are_named(tmp_path):
    good = tmp_path / "skills.yaml"
    good.write_text("- {keywords: [door], text: Doors open with toggle.}\n- {keywords: [key, ball], text: Pick it up.}\n")
    context = PrivilegedContext(PrivilegedConfig(skill_bank=str(good), max_skills=1))
    assert [s.text for s in context.bank.retrieve("pick up the key behind the door")] == ["Doors open with toggle."]
    (tmp_path / "skills.json").write_text(json.dumps([{"keywords": ["box"], "text": "Boxes are heavy."}]))
    assert load_skill_bank(str(tmp_path / "skills.json"))[0].text == "Boxes are heavy."
    for text, match in (("- {keywords: [], text: x}", "skill 0"), ("{a: 1}", "non-empty list"), ("[", "not valid")):
        good.write_text(text)
        with pytest.raises(ValueError, match=match):
            load_skill_bank(str(good))
    with pytest.raises(ValueError, match="does not exist"):
        load_skill_bank(str(tmp_path / "nope.yaml"))
    with pytest.raises(ValueError, match="oracle"):
        TeacherConfig(backend="oracle", privileged=PrivilegedConfig(map=True))


def test_tokenizer_mismatch_is_refused(tok, tmp_path):
    other = load_tokenizer(NANO)
    other.add_tokens(["<extra>"])
    with pytest.raises(ValueError, match="tokenizers differ"):
        check_same_tokenizer(tok, other)
    check_same_tokenizer(tok, load_tokenizer(NANO))


class CountingScorer:
    def __init__(self):
        self.calls = []

    def score_trajectories(self, trajectories, top_k=0):
        self.calls.append(len(trajectories))
        return [[TokenScores(tuple(-0.5 for _ in turn.response_ids)) for turn in t.turns] for t in trajectories]


def test_service_micro_batches_concurrent_requests(tok):
    traj = expert_trajectory(tok, seed=1, num_turns=2)

    async def main():
        scorer = CountingScorer()
        service = TeacherService(TeacherConfig(batch_window_s=0.2, max_batch_turns=1000), scorer)
        results = await asyncio.gather(*[service.score([dataclasses.replace(traj, trajectory_id=str(i))])
                                         for i in range(10)])
        stats = await service.stats()
        return scorer, results, stats

    scorer, results, stats = asyncio.run(main())
    assert scorer.calls == [10]  # ten callers, one scoring call
    assert [r[0].trajectory_id for r in results] == [str(i) for i in range(10)]
    assert all(t.teacher_logprobs == tuple(-0.5 for _ in t.response_ids) for r in results for t in r[0].turns)
    assert stats["num_requests"] == 10 and stats["num_batches"] == 1 and stats["queue_depth"] == 0


def test_service_respects_the_batch_size_and_reports_errors(tok):
    traj = expert_trajectory(tok, seed=1, num_turns=2)

    class Failing:
        def score_trajectories(self, trajectories, top_k=0):
            raise RuntimeError("teacher out of memory")

    async def main():
        scorer = CountingScorer()
        service = TeacherService(TeacherConfig(batch_window_s=0.2, max_batch_turns=2 * traj.num_turns), scorer)
        await asyncio.gather(*[service.score([traj]) for _ in range(5)])
        failing = TeacherService(TeacherConfig(batch_window_s=0.0), Failing())
        with pytest.raises(RuntimeError, match="out of memory"):
            await failing.score([traj])
        return scorer

    assert asyncio.run(main()).calls == [2, 2, 1]


def test_nesting_turns_are_scored_in_one_pass_with_the_same_logprobs(tok, model):
    loop = LoopConfig(max_turns=4, prompt=PromptConfig(history_window="all"))
    policy = ModelPolicy(HFEngine(model, tok.pad_token_id, [tok.convert_tokens_to_ids("<|im_end|>")]), tok,
                         SamplingConfig(max_new_tokens=8, seed=0), loop)
    trajs = [r.trajectory for r in run_episodes(BabyAITextEnv, [EpisodeTask("train", s) for s in (0, 1)], policy,
                                                loop)]

    class Recording(HFTeacherBackend):
        def score(self, requests, top_k=0):
            self.seen = list(requests)
            return super().score(requests, top_k)

    backend = Recording(model, tok.pad_token_id)
    packed = ModelTeacher(backend).score_trajectories(trajs, top_k=2)
    assert len(backend.seen) == 2  # one request per episode
    separate = HFTeacherBackend(model, tok.pad_token_id).score(
        [ScoreRequest(turn.prompt_ids, turn.response_ids) for t in trajs for turn in t.turns], top_k=2)
    flat = [s for per_traj in packed for s in per_traj]
    assert len(flat) == len(separate)
    for a, b in zip(flat, separate):
        assert len(a.logprobs) == len(b.logprobs) and max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
        assert a.topk_ids == b.topk_ids
    # A windowed episode does not nest: its turns are scored one by one, with the same result.
    windowed = dataclasses.replace(trajs[0], turns=tuple(
        dataclasses.replace(turn, prompt_ids=turn.prompt_ids[:3] + turn.prompt_ids[4:]) if k == 2 else turn
        for k, turn in enumerate(trajs[0].turns)))
    scores = ModelTeacher(backend).score_trajectories([windowed])[0]
    assert len(backend.seen) == 3  # turns 0-1 packed; turn 2 and turn 3 on their own
    assert [len(s.logprobs) for s in scores] == [len(t.response_ids) for t in windowed.turns]
    # Replayed turns (TCOD-B2F: untrainable, before the student's) are context, never asked about:
    # the request starts at the first trainable turn, and its scores are the same.
    replayed = dataclasses.replace(trajs[0], turns=tuple(dataclasses.replace(turn, trainable=k >= 2)
                                                         for k, turn in enumerate(trajs[0].turns)))
    scored = ModelTeacher(backend).score_trajectories([replayed], top_k=2)[0]
    (request,) = backend.seen
    assert request.prompt_ids == replayed.turns[2].prompt_ids
    assert scored[0] == TokenScores.unscored(len(replayed.turns[0].response_ids), 2) and scored[1].logprobs == \
        (0.0,) * len(replayed.turns[1].response_ids)
    for a, b in zip(scored[2:], packed[0][2:]):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4 and a.topk_ids == b.topk_ids


def test_the_service_rejects_non_finite_or_positive_teacher_logprobs_and_counts_them(tok):
    traj = expert_trajectory(tok, seed=1, num_turns=2)

    class Broken:
        """Trajectory "nan" gets a NaN on its last token, "pos" a positive log-prob."""

        def score_trajectories(self, trajectories, top_k=0):
            bad = {"nan": float("nan"), "pos": 0.7}
            return [[TokenScores(tuple(-0.5 for _ in turn.response_ids[:-1])
                                 + (bad.get(t.trajectory_id, -0.5),)) for turn in t.turns] for t in trajectories]

    async def main():
        service = TeacherService(TeacherConfig(batch_window_s=0.0), Broken())
        out = await service.score([dataclasses.replace(traj, trajectory_id=i) for i in ("ok", "nan", "pos")])
        return out, await service.stats()

    (ok, nan, pos), stats = asyncio.run(main())
    assert nan is None and pos is None and stats["num_rejected"] == 2
    assert all(turn.teacher_logprobs is not None for turn in ok.turns)
    assert not TokenScores((-0.1,), ((1,),), ((float("-inf"),),)).valid()  # top-k log-probs count too


def test_a_malformed_teacher_answer_fails_its_batch_and_the_service_serves_on(tok):
    traj = expert_trajectory(tok, seed=1, num_turns=2)

    class MalformedOnce:
        def __init__(self):
            self.calls = 0

        def score_trajectories(self, trajectories, top_k=0):
            self.calls += 1
            if self.calls == 1:  # one trajectory's turns missing: no answer can be built
                return [None for _ in trajectories]
            return [[TokenScores(tuple(-0.5 for _ in turn.response_ids)) for turn in t.turns] for t in trajectories]

    async def main():
        service = TeacherService(TeacherConfig(batch_window_s=0.0), MalformedOnce())
        with pytest.raises(TypeError):
            await asyncio.wait_for(service.score([traj]), 5)
        return await asyncio.wait_for(service.score([traj]), 5)  # the batcher is still alive

    answer, = asyncio.run(main())
    assert all(turn.teacher_logprobs is not None for turn in answer.turns)


def test_top_k_rows_hold_exactly_k_entries_on_ties_and_short_rows():
    from teacher.backends import scores_from_prompt_logprobs

    rows = [None, {5: (1, -0.1), 6: (2, -2.0), 7: (2, -2.0), 9: (4, -3.0)}, {8: (1, -0.2)}]
    scores = scores_from_prompt_logprobs([1, 5, 8], rows, num_response_tokens=2, top_k=2)
    assert scores.topk_ids == ((5, 6), (8, -1)) and scores.topk_logprobs == ((-0.1, -2.0), (-0.2, 0.0))
    assert scores.logprobs == (-0.1, -0.2) and scores.valid()
