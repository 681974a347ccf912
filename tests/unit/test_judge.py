"""Turn judges: prompt, score parsing, reward mix, the oracle judge, the service's cache and
neutral scores, and the HTTP judge's retries against a local OpenAI-style server (no Ray)."""

import asyncio
import dataclasses
import json
import threading
from http.server import ThreadingHTTPServer

import pytest
from hypothesis import given
from hypothesis import strategies as st

from buffer.contracts import Trajectory, Turn
from envs.babyai_text import BabyAITextEnv
from envs.parser import format_tool_call
from envs.protocol import ToolCall
from judge.http import HttpJudge, HttpJudgeConfig, JudgeAuthError, JudgeRequestError, judge_messages, parse_score
from judge.oracle import OracleJudge
from judge.service import JudgeConfig, JudgeService, judged_reward
from models.loading import ModelConfig, load_tokenizer
from tests.json_http import JsonHandler


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(ModelConfig(path="tiny:nano"))


def bot_trajectory(tok, seed, deviate_at=None, num_turns=8, trainable=None):
    """The bot's calls as turns (optionally one wrong call), executed calls recorded."""
    env = BabyAITextEnv()
    reset = env.reset(seed, "train")
    expert, last, turns = env.expert(), None, []
    for k in range(num_turns):
        call = expert.act(last)
        if k == deviate_at:
            call = ToolCall("turn_right" if call.name != "turn_right" else "turn_left")
        ids = tuple(tok.encode(format_tool_call(call), add_special_tokens=False))
        turns.append(Turn(k, (1, 2, 3), ids, tuple(-1.0 for _ in ids), 0,
                          trainable=trainable is None or k in trainable,
                          executed_call=json.dumps({"name": call.name, "arguments": {}})))
        last = call
        if env.step(call).done:
            break
    return Trajectory(f"t{seed}/{deviate_at}", "g", "train", seed, reset.info.task_type, tuple(turns), False, -1.0, 0.5,
                      task=reset.task)


def test_scores_are_read_from_the_last_tag_in_range():
    assert parse_score("The agent turned toward the key. <score>7</score>") == 0.7
    assert parse_score("<score>2</score> on reflection <SCORE> 9.5 </SCORE>") == 0.95
    assert parse_score("<score>10</score>") == 1.0 and parse_score("<score>0</score>") == 0.0
    for bad in (None, "", "score: 7", "<score>11</score>", "<score>-1</score>", "<score>seven</score>", "<score></score>"):
        assert parse_score(bad) is None, bad


@given(st.text())
def test_any_answer_parses_to_a_score_in_range_or_none(answer):
    score = parse_score(answer)
    assert score is None or 0.0 <= score <= 1.0


@given(st.text(), st.floats(min_value=0, max_value=10, allow_nan=False), st.text())
def test_a_tagged_score_survives_any_text_around_it(before, value, after):
    tail = after.replace("<", "")  # no later tag
    assert parse_score(f"{before}<score>{value:.2f}</score>{tail}") == pytest.approx(round(value, 2) / 10)


def test_the_judge_prompt_names_the_turn_and_holds_the_episode_and_rubric():
    system, user = judge_messages("Be fair.", "EPISODE TEXT", 2, 5)
    assert system["role"] == "system" and "Be fair." in system["content"] and "<score>N</score>" in system["content"]
    assert "EPISODE TEXT" in user["content"] and "Score turn 3 of 5 (the agent's 3rd turn, marked" in user["content"]


def chat_trajectory(tok, observations, calls, success):
    """Turns whose prompts are the chat template's rendering of the whole history, as the agent
    loop renders them: the task, then each call and the tool's answer."""
    messages = [{"role": "system", "content": "You move in a grid."}, {"role": "user", "content": observations[0]}]
    turns = []
    for k, call in enumerate(calls):
        prompt = tok.encode(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                            add_special_tokens=False)
        response = tuple(tok.encode(f"<think>step {k}</think>{call}<|im_end|>", add_special_tokens=False))
        turns.append(Turn(k, tuple(prompt), response, tuple(-1.0 for _ in response), 0))
        messages += [{"role": "assistant", "content": f"<think>step {k}</think>{call}"},
                     {"role": "tool", "content": observations[k + 1]}]
    return Trajectory("c", "g", "train", 0, "go_to", tuple(turns), success, 1.0 if success else -1.0, 0.5)


def test_the_judge_reads_the_whole_episode_with_its_outcome_and_loses_only_middle_turns():
    """Document 000's judge reads the whole trajectory with its outcome and scores the marked
    turn; a long episode loses turns from its middle, never the task, that turn or the outcome."""
    from judge.http import JUDGED, episode_parts, episode_view, last_message

    tok = load_tokenizer(ModelConfig(path="tiny:nano"))
    observations = ["Go to the red ball. You see a wall 2 steps forward."] + [f"observation {k}" for k in range(1, 9)]
    calls = [f"call_{k}" for k in range(8)]
    t = chat_trajectory(tok, observations, calls, success=True)
    assert last_message(tok.decode(list(t.turns[3].prompt_ids))) == "observation 3"
    parts = episode_parts(t, tok)
    whole = episode_view(parts, judged=2, budget=100_000)
    for k in range(8):
        assert f"<think>step {k}</think>call_{k}" in whole and f"--- Turn {k + 1}" in whole
        assert f"Environment: observation {k + 1}" in whole or k == 7  # the last answer ends the episode
    assert observations[0] in whole and "You move in a grid." in whole and f"--- Turn 3 {JUDGED} ---" in whole
    assert whole.rstrip().endswith("Outcome: the episode succeeded after 8 turns (outcome reward +1).")
    assert whole.count(JUDGED) == 1 and "omitted" not in whole
    # Room for the task, the outcome, the judged turn and two more: the first and the last stay.
    budget = parts.head[1] + parts.outcome[1] + parts.steps[5][1] + parts.steps[0][1] + parts.steps[7][1]
    short = episode_view(parts, judged=5, budget=budget)
    assert [f"call_{k}" in short for k in range(8)] == [True, False, False, False, False, True, False, True]
    assert "[... 4 turn(s) omitted ...]" in short and "[... 1 turn(s) omitted ...]" in short
    assert observations[0] in short and "Outcome: the episode succeeded" in short
    # Even a budget too small for the essentials keeps them (the server then says what it accepts).
    tiny = episode_view(parts, judged=5, budget=0)
    assert "call_5" in tiny and observations[0] in tiny and "Outcome:" in tiny and "[... 5 turn(s) omitted ...]" in tiny


def test_reward_mixes_outcome_judge_and_the_turn_format_term(tok):
    t = bot_trajectory(tok, 0)
    t = dataclasses.replace(t, outcome_reward=1.0, turns=(dataclasses.replace(t.turns[0], turn_reward=-0.1),)
                            + t.turns[1:])
    seed_mix = JudgeConfig()
    assert judged_reward(seed_mix, t, 0, 1.0) == pytest.approx(0.5 + 0.5 - 0.1)
    assert judged_reward(seed_mix, t, 0, 0.0) == pytest.approx(0.5 - 0.5 - 0.1)
    assert judged_reward(JudgeConfig(outcome_weight=0, judge_weight=1), t, 1, 0.5) == 0.0
    with pytest.raises(ValueError, match="both 0"):
        JudgeConfig(outcome_weight=0, judge_weight=0)


def test_the_oracle_judge_scores_the_bots_calls_1_and_a_deviation_0(tok):
    judge = OracleJudge(BabyAITextEnv())
    straight = bot_trajectory(tok, 3)
    assert [asyncio.run(judge.score(straight, k)) for k in range(straight.num_turns)] == [1.0] * straight.num_turns
    deviated = bot_trajectory(tok, 3, deviate_at=1)
    assert [asyncio.run(judge.score(deviated, k)) for k in range(3)] == [1.0, 0.0, 1.0]


class CountingBackend:
    def __init__(self, scores):
        self.scores, self.calls = scores, []

    async def check(self):
        pass

    async def score(self, trajectory, turn):
        self.calls.append((trajectory.trajectory_id, turn))
        return self.scores.get(turn)

    async def close(self):
        pass


def test_the_service_judges_trainable_turns_once_and_counts_neutral_ones(tok):
    backend = CountingBackend({0: 1.0, 2: 0.0})  # turn 3 unscored: neutral
    service = JudgeService(JudgeConfig(), backend)
    t = bot_trajectory(tok, 3, trainable={0, 2, 3})
    judged, = asyncio.run(service.judge([t]))
    rewards = [turn.turn_reward for turn in judged.turns]
    assert rewards[0] == pytest.approx(-0.5 + 0.5) and rewards[2] == pytest.approx(-0.5 - 0.5)
    assert rewards[3] == pytest.approx(-0.5) and rewards[1] == 0.0  # neutral: outcome term only; 1 untouched
    asyncio.run(service.judge([t]))  # a re-delivered group: nothing judged twice
    assert sorted(backend.calls) == [(t.trajectory_id, k) for k in (0, 2, 3)]
    assert service.stats() == {"num_turns_judged": 3, "num_neutral": 2, "num_cache_hits": 3}
    # The group re-run after a worker restart: same trajectory ids, another episode (here a
    # different last response). Its turns are judged again, never given the first run's scores.
    last = t.turns[-1]
    rerun = dataclasses.replace(t, turns=t.turns[:-1] + (dataclasses.replace(last, prompt_ids=(1, 2, 4)),))
    backend.scores = {0: 0.0, 2: 1.0}
    judged, = asyncio.run(service.judge([rerun]))
    assert judged.turns[0].turn_reward == pytest.approx(-0.5 - 0.5) and len(backend.calls) == 6


def test_a_judge_score_that_is_nan_or_out_of_range_is_rejected_as_neutral(tok):
    backend = CountingBackend({0: float("nan"), 2: 1.5, 3: 1.0})
    service = JudgeService(JudgeConfig(), backend)
    judged, = asyncio.run(service.judge([bot_trajectory(tok, 3, trainable={0, 2, 3})]))
    rewards = [turn.turn_reward for turn in judged.turns]
    assert rewards[0] == rewards[2] == pytest.approx(-0.5) and rewards[3] == pytest.approx(0.0)
    assert service.stats()["num_neutral"] == 2


class OpenAIStyle(JsonHandler):
    """A chat-completions endpoint whose answers the test scripts (a stand-in server for the
    client's retry and parsing logic; the real server path is tested against `vllm serve`)."""

    answers: list = []
    requests: list = []

    def do_GET(self):
        if self.headers.get("Authorization") != "Bearer right":
            return self.reply(401, {"error": {"message": "bad key", "type": "auth"}})
        self.reply(200, {"object": "list", "data": [{"id": "judge", "object": "model", "created": 0, "owned_by": "x"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        OpenAIStyle.requests.append(body)
        status, text = OpenAIStyle.answers.pop(0) if OpenAIStyle.answers else (200, "<score>5</score>")
        if status != 200:
            return self.reply(status, {"error": {"message": "unavailable", "type": "server"}})
        self.reply(200, {"id": "c", "object": "chat.completion", "created": 0, "model": "judge",
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": text}}]})


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), OpenAIStyle)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    OpenAIStyle.answers, OpenAIStyle.requests = [], []
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


def test_http_judge_retries_failures_and_unparsed_answers_then_gives_up(tok, server, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "right")
    config = HttpJudgeConfig(base_url=server, model="judge", api_key_env="JUDGE_KEY", max_retries=2, backoff_s=0.01)
    t = bot_trajectory(tok, 3)

    async def run(answers):
        OpenAIStyle.answers = list(answers)
        judge = HttpJudge(config, tok)
        try:
            await judge.check()
            return await judge.score(t, 1)
        finally:
            await judge.close()

    assert asyncio.run(run([(503, ""), (200, "no tag here"), (200, "fine <score>8</score>")])) == 0.8
    assert len(OpenAIStyle.requests) == 3
    user = OpenAIStyle.requests[0]["messages"][1]["content"]
    assert "Score turn 2 of" in user and tok.decode(t.turns[-1].response_ids) in user
    assert asyncio.run(run([(503, "")] * 3)) is None  # after its retries: no score (the service makes it neutral)
    assert asyncio.run(run([(429, ""), (200, "<score>3</score>")])) == 0.3  # rate-limited: retried
    OpenAIStyle.requests = []
    with pytest.raises(JudgeRequestError, match="refused the request with 400"):  # not retried, not neutral
        asyncio.run(run([(400, ""), (200, "<score>3</score>")]))
    assert len(OpenAIStyle.requests) == 1
    monkeypatch.setenv("JUDGE_KEY", "wrong")
    with pytest.raises(JudgeAuthError, match="refused the API key"):
        asyncio.run(run([]))
    monkeypatch.delenv("JUDGE_KEY")
    with pytest.raises(ValueError, match="JUDGE_KEY is not set"):
        HttpJudge(config, tok)
    with pytest.raises(ValueError, match="not served"):
        monkeypatch.setenv("JUDGE_KEY", "right")
        asyncio.run(HttpJudge(config.model_copy(update={"model": "other"}), tok).check())
