"""The agent gateway (actors/gateway.py) in-process: programs over real HTTP, an engine whose answer
is a function of the prompt (so two paths get the same answers exactly when they build the same
prompts), and the built-in loop as the reference. No Ray."""

import hashlib
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest

from actors.agent_loop import AGENT_FAILED, EpisodeTask, LoopConfig, ModelPolicy, run_episodes
from actors.engine import Generation, SamplingConfig
from actors.gateway import GatewayRunner, end_session
from envs.gateway import GatewayConfig
from envs.parser import format_tool_call
from envs.prompt import PromptConfig
from envs.protocol import ToolCall
from envs.registry import make_env, parse_env_config
from models.loading import ModelConfig, load_tokenizer

TASKS = {"name": "babyai_text", "room_size": 6, "num_distractors": 0, "task_types": ["go_to", "pick_up"]}
LOOP = LoopConfig(max_turns=6, max_context_tokens=2048, prompt=PromptConfig(history_window="all", tools="compact"))
ANSWERS = [format_tool_call(ToolCall("go_forward")), format_tool_call(ToolCall("turn_left")),
           "<think>the ball is ahead</think>\n" + format_tool_call(ToolCall("go_forward")),
           "I should go forward now", format_tool_call(ToolCall("pick_up"))]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(ModelConfig(path="tiny:nano"))


class PromptHashEngine:
    """Answers each prompt with one of ANSWERS (log-probs included) chosen by the prompt's hash.
    `split_ids`: answers as one token per character, a tokenisation re-encoding would not give."""

    version = 5

    def __init__(self, tok, split_ids=False):
        stop = tok.convert_tokens_to_ids("<|im_end|>")
        encode = (lambda t: [i for c in t for i in tok.encode(c, add_special_tokens=False)]) if split_ids else \
            (lambda t: tok.encode(t, add_special_tokens=False))
        self.answers = [tuple(encode(text)) + (stop,) for text in ANSWERS]
        self.prompts = []

    def generate(self, prompts, sampling):
        out = []
        for prompt in prompts:
            self.prompts.append(list(prompt))
            h = int(hashlib.sha256(json.dumps(list(prompt)).encode()).hexdigest(), 16)
            ids = self.answers[h % len(self.answers)]
            cut = ids[:sampling.max_new_tokens]
            out.append(Generation(cut, tuple(-((h >> i) % 9) / 10 for i in range(len(cut))),
                                  "stop" if len(cut) == len(ids) else "length"))
        return out


def gateway_env(**fields):
    return parse_env_config({"name": "gateway", "tasks": TASKS, **fields})


def play(runner, tasks, policy, timeout_s=60):
    """Every task once through the runner, as the rollout worker drives it; results in task order."""
    results, pending, deadline = {}, list(tasks), time.monotonic() + timeout_s
    while pending or runner.num_active:
        assert time.monotonic() < deadline, "sessions did not end"
        n = min(len(pending), runner.num_free)
        runner.start_many([(t, t.trajectory_id) for t in pending[:n]])
        pending = pending[n:]
        results.update(runner.step(policy))
    return [results[t.trajectory_id] for t in tasks]


def run_gateway(config, tasks, policy, num_slots=4, **kw):
    runner = GatewayRunner(lambda: make_env(config), num_slots, LOOP)
    try:
        return play(runner, tasks, policy, **kw), runner
    finally:
        runner.close()


def test_concurrent_sessions_of_the_example_agent_record_what_the_built_in_loop_records(tok):
    """Four sessions at once (one group), token for token: prompt ids, response ids, log-probs,
    versions, format verdicts, executed calls, rewards -- malformed turns and <think> included."""
    policy = ModelPolicy(PromptHashEngine(tok), tok, SamplingConfig(max_new_tokens=24), LOOP)
    tasks = [EpisodeTask("train", seed, "g", i) for i, seed in enumerate([3, 3, 8, 11])]
    config = gateway_env(callable="examples.gateway_agent:run")
    built_in = run_episodes(lambda: make_env(config.tasks), tasks, policy, LOOP, batch_size=4)
    through_gateway, runner = run_gateway(config, tasks, policy)
    assert runner.num_branches == 0
    turns = [t for r in built_in for t in r.trajectory.turns]
    assert len(turns) >= 12 and {t.well_formed for t in turns} == {True, False}, "the answers must mix formats"
    for ours, theirs in zip(through_gateway, built_in):
        assert ours.trajectory == theirs.trajectory
        assert (ours.success, ours.truncated, ours.reward) == (theirs.success, theirs.truncated, theirs.reward)


def test_a_continued_call_reuses_the_generated_ids_never_a_re_tokenisation(tok):
    engine = PromptHashEngine(tok, split_ids=True)
    policy = ModelPolicy(engine, tok, SamplingConfig(max_new_tokens=160), LOOP)
    [result], _ = run_gateway(gateway_env(callable="examples.gateway_agent:run"),
                              [EpisodeTask("train", 3, "g", 0)], policy, num_slots=1)
    turns = result.trajectory.turns
    assert len(turns) >= 3
    for before, after in zip(turns, turns[1:]):
        assert after.prompt_ids[:len(before.prompt_ids) + len(before.response_ids)] == \
            before.prompt_ids + before.response_ids
        assert before.response_ids in engine.answers  # exactly the engine's ids
    text = tok.decode(turns[0].response_ids)
    assert tuple(tok.encode(text, add_special_tokens=False)) != turns[0].response_ids, \
        "the engine's ids must differ from a re-encoding, or this test could not fail"


SENT = []


def edit_history(session):
    """Two calls; the second with the first user message edited (a branch), then a reward."""
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key)
    messages = [{"role": "system", "content": "rules"}, {"role": "user", "content": "go to the ball"}]
    reply = client.chat.completions.create(model="m", messages=messages).choices[0].message
    messages = messages + [{"role": "assistant", "content": reply.content or ""}, {"role": "user", "content": "and now?"}]
    messages[1] = {"role": "user", "content": "go to the red ball"}
    SENT.append(messages)
    client.chat.completions.create(model="m", messages=messages)
    end_session(session.gateway_url, session.api_key, session.session_id, success=True)


def test_edited_history_is_recorded_as_a_new_branch(tok):
    policy = ModelPolicy(PromptHashEngine(tok), tok, SamplingConfig(max_new_tokens=24), LOOP)
    [result], runner = run_gateway(gateway_env(callable=f"{__name__}:edit_history"),
                                   [EpisodeTask("train", 0, "g", 0)], policy, num_slots=1)
    first, second = result.trajectory.turns
    assert runner.num_branches == 1 and result.success
    assert second.prompt_ids[:len(first.prompt_ids)] != first.prompt_ids
    rendered = tok.apply_chat_template(SENT[-1], add_generation_prompt=True, tokenize=True, return_dict=False)
    assert list(second.prompt_ids) == list(rendered)


def test_a_crashing_and_a_hanging_program_end_their_sessions_as_failures(tok, tmp_path, capsys):
    policy = ModelPolicy(PromptHashEngine(tok), tok, SamplingConfig(max_new_tokens=24), LOOP)
    crash = gateway_env(command=f"{sys.executable} -c 'import sys; print(\"boom\"); sys.exit(3)'")
    [crashed], _ = run_gateway(crash, [EpisodeTask("train", 0, "g", 0)], policy, num_slots=1)
    assert crashed.truncated == AGENT_FAILED and not crashed.success and crashed.trajectory is None
    assert "exited with status 3" in capsys.readouterr().out
    pid_file = tmp_path / "pid"
    hang = gateway_env(command=f"echo $$ > {pid_file}; exec sleep 60", session_timeout_s=1.0)
    start = time.monotonic()
    [hung], _ = run_gateway(hang, [EpisodeTask("train", 0, "g", 0)], policy, num_slots=1)
    assert hung.truncated == AGENT_FAILED and time.monotonic() - start < 5
    assert "timed out" in capsys.readouterr().out
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def post(url, body, key=None):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_calls_without_the_key_are_refused_and_bad_requests_named(tok):
    runner = GatewayRunner(lambda: make_env(gateway_env(command="sleep 30", api_key="secret")), 1, LOOP)
    try:
        assert runner.url.startswith("http://127.0.0.1:")
        runner.start(EpisodeTask("train", 0, "g", 0))
        [session_id] = runner._open
        chat = f"{runner.url}/sessions/{session_id}/v1/chat/completions"
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        assert post(chat, body)[0] == 401
        assert post(chat, body, key="wrong")[0] == 401
        assert post(f"{runner.url}/v1/chat/completions", body, key="secret")[0] == 400  # no session named
        assert post(f"{runner.url}/sessions/nope/v1/chat/completions", body, key="secret")[0] == 404
        status, answer = post(chat, {**body, "n": 2}, key="secret")
        assert status == 400 and "n must be 1" in answer["error"]["message"]
        reward = f"{runner.url}/v1/sessions/{session_id}/reward"
        assert post(reward, {"success": "yes"}, key="secret")[0] == 400
        assert post(reward, {"success": False, "score": 2}, key="secret")[0] == 400
        assert post(reward, {"success": True}, key="secret") == (200, {"session_id": session_id, "status": "ended"})
        assert post(reward, {"success": True}, key="secret")[0] == 409  # once
    finally:
        runner.close()


def test_the_gateway_config_names_what_is_wrong():
    with pytest.raises(ValueError, match="exactly one of env.command"):
        gateway_env()
    with pytest.raises(ValueError, match="module:function"):
        gateway_env(callable="examples.gateway_agent")
    from jobs.train import JobConfig

    with pytest.raises(ValueError, match="rollout.env_actors"):
        JobConfig.model_validate({"env": {"name": "gateway", "command": "x", "tasks": TASKS},
                                  "rollout": {"env_actors": True}})
    config = gateway_env(command="x")
    assert isinstance(config, GatewayConfig) and make_env(config).task_types == ("go_to", "pick_up")


def test_a_persistent_program_serves_its_slots_sessions_and_is_restarted_after_a_failure(tok, tmp_path):
    """env.persistent: one process per slot reads sessions on stdin. The example agent plays four
    sessions on two slots (two processes, equal to the built-in loop); a program that dies on its
    second session fails only that one and is started again for the next."""
    policy = ModelPolicy(PromptHashEngine(tok), tok, SamplingConfig(max_new_tokens=24), LOOP)
    tasks = [EpisodeTask("train", seed, "g", i) for i, seed in enumerate([3, 8, 11, 12])]
    config = gateway_env(command=f"{sys.executable} -m examples.gateway_agent", persistent=True)
    runner = GatewayRunner(lambda: make_env(config), 2, LOOP)
    try:
        ours = play(runner, tasks, policy)
        assert len(runner._persistent) == 2
        pids = {p.process.pid for p in runner._persistent.values()}
    finally:
        runner.close()
    theirs = run_episodes(lambda: make_env(config.tasks), tasks, policy, LOOP, batch_size=2)
    assert [r.trajectory for r in ours] == [r.trajectory for r in theirs] and len(pids) == 2
    # Each line: the first session ends with a reward, the second kills the process.
    starts = tmp_path / "starts"
    script = tmp_path / "flaky.py"
    script.write_text(
        "import json, sys\nfrom actors.gateway import end_session\n"
        f"open({str(starts)!r}, 'a').write('start\\n')\n"
        "for n, line in enumerate(sys.stdin):\n"
        "    s = json.loads(line)\n"
        "    if n == 1:\n        sys.exit(5)\n"
        "    end_session(s['gateway_url'], s['api_key'], s['session_id'], success=True)\n")
    flaky = gateway_env(command=f"{sys.executable} {script}", persistent=True)
    results, _ = run_gateway(flaky, [EpisodeTask("train", s, "g", s) for s in range(3)], policy, num_slots=1)
    assert [r.success for r in results] == [True, False, True]
    assert [r.truncated for r in results] == [None, AGENT_FAILED, None]
    assert starts.read_text().count("start") == 2


def test_a_streamed_call_is_answered_as_the_same_message_in_chunks(tok):
    """`stream: true` (the `openai` client's streaming): the chunks add up to the message,
    finish reason and usage an unstreamed call with the same messages gets, and both sessions
    record the same turns."""
    policy = ModelPolicy(PromptHashEngine(tok), tok, SamplingConfig(max_new_tokens=24), LOOP)
    runner = GatewayRunner(lambda: make_env(gateway_env(command="sleep 30")), 2, LOOP)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            runner.step(policy)

    server = threading.Thread(target=serve, daemon=True)
    try:
        runner.start_many([(EpisodeTask("train", 0, "g", i), i) for i in range(2)])
        plain_id, streamed_id = runner._open
        server.start()
        client = openai.OpenAI(base_url=f"{runner.url}/v1", api_key=runner.api_key)
        seen = set()
        # These five prompts draw all five ANSWERS from the engine.
        for text in ("go to the red ball", "pick up the key", "where is the box?", "a", "go forward"):
            messages = [{"role": "user", "content": text}]
            plain = client.chat.completions.create(model="m", messages=messages,
                                                   extra_headers={"X-Session-Id": plain_id})
            chunks = list(client.chat.completions.create(model="m", messages=messages, stream=True,
                                                         stream_options={"include_usage": True},
                                                         extra_headers={"X-Session-Id": streamed_id}))
            deltas = [c.choices[0].delta for c in chunks if c.choices]
            message = plain.choices[0].message
            assert "".join(d.content or "" for d in deltas) == message.content
            calls = [call for d in deltas for call in d.tool_calls or []]
            assert [(c.function.name, c.function.arguments) for c in calls] == \
                [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
            assert all(c.id and c.type == "function" for c in calls)  # ids name the session's turn
            extras = {k: v for d in deltas for k, v in (d.model_extra or {}).items()}
            assert extras == (message.model_extra or {})
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == plain.choices[0].finish_reason
            assert chunks[-1].usage == plain.usage
            seen.add("format_error" if "format_error" in extras else "call" if calls else "text")
        assert {"format_error", "call"} <= seen, "the answers must include a tool call and a malformed one"
        plain_turns, streamed_turns = (runner._open[i].ep.turns for i in (plain_id, streamed_id))
        assert len(plain_turns) == 5
        assert [t.response_ids for t in plain_turns] == [t.response_ids for t in streamed_turns]
    finally:
        stop.set()
        server.join(timeout=10)
        runner.close()
