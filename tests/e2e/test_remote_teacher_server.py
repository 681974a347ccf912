"""The remote teacher and the HTTP judge against a real vLLM OpenAI-compatible server of the nano
model on 127.0.0.1 (started by the test, stopped by its process group): agreement with the
in-process vLLM backend, a short OPD run of `jobs.train` scoring through it, turns judged through
its chat API, and a server that dies while scoring and judging.

The tests share one server and run in file order: the last one kills it.
"""

import asyncio
import os
import socket
import subprocess
import sys

import pytest

from models.vllm_server import ServerConfig, VLLMServer
from models.loading import ModelConfig, load_tokenizer
from teacher.backends import ScoreRequest
from teacher.remote import RemoteConfig, RemoteTeacherBackend, RemoteTeacherError
from cluster.local import free_port
from tests.e2e.test_train_job import HF_ENGINE, ROOT, SHORT, job_env

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
NANO = ModelConfig(path="tiny:nano")
KEY = "APPRENTICE_TEST_SERVER_KEY"
"""The server requires the key in this variable; every client here sends it (jobs inherit it)."""


@pytest.fixture(scope="module")
def server():
    os.environ[KEY] = "test-key-4b1d"
    with VLLMServer(ServerConfig(model=NANO, max_model_len=2048, api_key_env=KEY)) as running:
        yield running


def requests(tokenizer, count: int) -> list[ScoreRequest]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Go to the red ball."}], tokenize=False,
                                         add_generation_prompt=True)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    response = tokenizer('<tool_call>\n{"name": "go_forward", "arguments": {}}\n</tool_call><|im_end|>',
                         add_special_tokens=False)["input_ids"]
    return [ScoreRequest(tuple(prompt[: len(prompt) - i]), tuple(response)) for i in range(count)]


def test_remote_logprobs_match_the_in_process_vllm_backend(server):
    from actors.vllm_engine import VLLMConfig, VLLMEngine
    from teacher.backends import VLLMTeacherBackend

    tokenizer = load_tokenizer(NANO)
    batch = requests(tokenizer, 6)
    remote = RemoteTeacherBackend(RemoteConfig(url=server.url, api_key_env=KEY), tokenizer)
    # Its engine core in this process: half the start of its own (docs/vllm_cpu.md); the scores
    # are the same model's either way.
    local_engine = VLLMEngine(server.model_dir, VLLMConfig(max_model_len=2048, in_process=True),
                              [tokenizer.convert_tokens_to_ids("<|im_end|>")])
    try:
        for top_k in (0, 3):
            here = VLLMTeacherBackend(local_engine).score(batch, top_k)
            there = remote.score(batch, top_k)
            for a, b in zip(here, there, strict=True):
                assert len(a.logprobs) == len(b.logprobs) == len(batch[0].response_ids)
                assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
                assert a.topk_ids == b.topk_ids
                if top_k:
                    assert max(abs(x - y) for ra, rb in zip(a.topk_logprobs, b.topk_logprobs)
                               for x, y in zip(ra, rb)) < 1e-4
    finally:
        local_engine.close()
        remote.close()


def test_a_short_opd_run_scores_through_the_remote_teacher(server, tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "jobs.train", *SHORT, *HF_ENGINE, f"run.dir={run_dir}", "run.steps=3",
                           "run.eval_every=0", f"run.metrics_port={free_port()}", "teacher.backend=remote",
                           f"teacher.remote.url={server.url}", f"teacher.remote.api_key_env={KEY}"], cwd=ROOT, env=job_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "step    3" in proc.stdout
    import pyarrow.parquet as pq

    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    # Scored by the served model: the nano student against the same weights, so the sampled
    # tokens' reverse KL is ~0 (the rollout engine's weights move by 3 small steps).
    assert len(rows) == 3 and all(r["num_loss_tokens"] > 0 and abs(r["reverse_kl"]) < 0.5 for r in rows)
    assert all(r["topk_kl"] > 0 for r in rows)


def test_a_bad_url_fails_before_any_actor_starts(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens once the socket is closed
    proc = subprocess.run([sys.executable, "-m", "jobs.train", *SHORT, f"run.dir={tmp_path / 'run'}",
                           "teacher.backend=remote", f"teacher.remote.url=http://127.0.0.1:{closed}/v1",
                           "teacher.remote.timeout_s=2"], cwd=ROOT, env=job_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "does not answer" in proc.stderr and "Traceback" not in proc.stderr
    assert "ray namespace" not in proc.stdout  # stopped before connecting to Ray


def judge_config(server):
    from judge.http import HttpJudgeConfig
    from judge.service import JudgeConfig

    # The served name is the model directory (vLLM's default); short answers keep the nano model quick.
    return JudgeConfig(backend="http", http=HttpJudgeConfig(base_url=server.url, model=str(server.model_dir),
                                                            api_key_env=KEY, max_retries=1, backoff_s=0.05,
                                                            max_tokens=24))


def test_a_judge_with_a_wrong_api_key_fails_before_any_actor_starts(server, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "jobs.train", "--config", "jobs/configs/babyai_turn_judge_tiny.yaml",
                           "model.path=tiny:nano", f"run.dir={tmp_path / 'run'}", "judge.backend=http",
                           f"judge.http.base_url={server.url}", f"judge.http.model={server.model_dir}",
                           "judge.http.api_key_env=WRONG_JUDGE_KEY"], cwd=ROOT,
                          env={**job_env(), "WRONG_JUDGE_KEY": "not-the-key"}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "refused the API key" in proc.stderr and "Traceback" not in proc.stderr
    assert "ray namespace" not in proc.stdout  # stopped before connecting to Ray


def test_the_judge_scores_turns_through_the_served_chat_api(server):
    """The nano model's answers are noise, so a turn gets its score or, unparsed after the retry,
    the neutral one; either way every trainable turn is judged once and nothing fails."""
    from judge.http import HttpJudge
    from judge.service import JudgeService

    tokenizer = load_tokenizer(NANO)
    config = judge_config(server)
    trajectories = trajectories_of(requests(tokenizer, 4))

    async def scenario():
        judge = HttpJudge(config.http, tokenizer)
        await judge.check()
        service = JudgeService(config, judge)
        first = await service.judge(trajectories)
        again = await service.judge(trajectories)  # from the cache
        await judge.close()
        return first, again, service.stats()

    first, again, stats = asyncio.run(scenario())
    assert stats["num_turns_judged"] == 4 and stats["num_cache_hits"] == 4
    assert [t.turns[0].turn_reward for t in first] == [t.turns[0].turn_reward for t in again]
    # outcome 0 here: the reward is 0.5 · (2s − 1), within [-0.5, 0.5], exactly 0 when neutral
    assert all(-0.5 <= t.turns[0].turn_reward <= 0.5 for t in first)


def test_a_server_killed_while_scoring_fails_every_waiting_caller(server):
    """Retried by the client, then one clear error for each caller of the batch; no caller gets
    a partial answer (the rollout worker's delivery fails, so its group is never stored). The
    judge instead gives the neutral score, counted, and its caller goes on."""
    from judge.http import HttpJudge
    from judge.service import JudgeService
    from teacher.service import ModelTeacher, TeacherConfig, TeacherService

    tokenizer = load_tokenizer(NANO)
    backend = RemoteTeacherBackend(RemoteConfig(url=server.url, api_key_env=KEY, max_retries=2, timeout_s=10),
                                   tokenizer)
    service = TeacherService(TeacherConfig(backend="remote"), ModelTeacher(backend))
    trajectories = trajectories_of(requests(tokenizer, 4))
    config = judge_config(server)

    async def scenario():
        judge = JudgeService(config, HttpJudge(config.http, tokenizer))
        assert len(await service.score(trajectories[:1])) == 1  # the server answers
        server.stop()
        outcomes = await asyncio.gather(*(service.score([t]) for t in trajectories), return_exceptions=True)
        judged = await judge.judge(trajectories)
        return outcomes, judged, judge.stats()

    outcomes, judged, stats = asyncio.run(scenario())
    assert all(isinstance(o, RemoteTeacherError) for o in outcomes), outcomes
    assert "after 2 retries" in str(outcomes[0])
    assert [t.turns[0].turn_reward for t in judged] == [0.0] * 4 and stats["num_neutral"] == 4


def trajectories_of(batch: list[ScoreRequest]):
    from buffer.contracts import Trajectory, Turn

    return [Trajectory(trajectory_id=f"t{i}", group_id="g", split="train", task_seed=i, task_type="go_to",
                       turns=(Turn(turn_index=0, prompt_ids=r.prompt_ids, response_ids=r.response_ids,
                                   behaviour_logprobs=(-1.0,) * len(r.response_ids), policy_version=0),),
                       success=False, outcome_reward=0.0, format_reward=0.0)
            for i, r in enumerate(batch)]
