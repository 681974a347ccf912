"""The remote teacher backend against a fake OpenAI-compatible server on loopback: parsing of vLLM's
prompt log-probs, retries, the tokenizer check, and the errors a user sees. (The real `vllm serve`
is in tests/e2e/test_remote_teacher_server.py.)"""

import json
import threading
from http.server import ThreadingHTTPServer

import pytest

from models.loading import ModelConfig, load_tokenizer
from teacher.backends import ScoreRequest
from teacher.remote import PROBE, RemoteConfig, RemoteTeacherBackend, RemoteTeacherError, check_server
from tests.json_http import JsonHandler

TOKENIZER = load_tokenizer(ModelConfig(path="tiny:nano"))


def logprob(position: int, token: int) -> float:
    """The fake teacher's log-prob of `token` at `position`: distinct, easy to check."""
    return -0.01 * position - 0.001 * (token % 100)


class FakeServer:
    """/v1/models, /tokenize and /v1/completions with prompt log-probs like vLLM's; the first
    `num_failures` completions answer 503."""

    def __init__(self, num_failures: int = 0, tokenize_shift: int = 0, tokenizer=TOKENIZER) -> None:
        state = self
        self.num_failures, self.completions, self.auth = num_failures, 0, []

        class Handler(JsonHandler):
            def do_GET(self):
                assert self.path == "/v1/models"
                self.reply(200, {"object": "list", "data": [{"id": "teacher", "max_model_len": 512}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                state.auth.append(self.headers.get("Authorization"))
                if self.path == "/tokenize":
                    ids = tokenizer(body["prompt"], add_special_tokens=False)["input_ids"]
                    self.reply(200, {"tokens": [i + tokenize_shift for i in ids]})
                    return
                assert self.path == "/v1/completions" and body["max_tokens"] == 1
                state.completions += 1
                if state.completions <= state.num_failures:
                    self.reply(503, {"error": {"message": "overloaded"}})
                    return
                ids, k = body["prompt"], body["prompt_logprobs"]
                rows = [None]
                for j in range(1, len(ids)):
                    row = {str(ids[j]): {"logprob": logprob(j, ids[j]), "rank": 7, "decoded_token": "x"}}
                    for rank, token in enumerate((11, 12, 13)[:k], start=1):
                        row[str(token)] = {"logprob": -0.1 * rank, "rank": rank, "decoded_token": "y"}
                    rows.append(row)
                self.reply(200, {"id": "c", "object": "text_completion", "created": 0, "model": "teacher",
                                 "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length",
                                              "prompt_logprobs": rows}]})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = FakeServer(num_failures=2)
    yield s
    s.close()


def test_scores_come_from_the_prompt_logprobs_of_the_response_positions(server, monkeypatch):
    monkeypatch.setenv("TEACHER_KEY", "s3cret")
    backend = RemoteTeacherBackend(RemoteConfig(url=server.url, api_key_env="TEACHER_KEY", max_retries=3), TOKENIZER)
    requests = [ScoreRequest((5, 6, 7), (40, 41)), ScoreRequest((9,), (50, 51, 52))]
    first, second = backend.score(requests, top_k=2)
    assert first.logprobs == (logprob(3, 40), logprob(4, 41))
    assert second.logprobs == tuple(logprob(j, t) for j, t in zip((1, 2, 3), (50, 51, 52)))
    assert second.topk_ids == ((11, 12),) * 3 and second.topk_logprobs == ((-0.1, -0.2),) * 3
    # The two 503s were retried (by the openai client, with backoff): 2 failures + 2 requests.
    assert server.completions == 4
    assert set(server.auth) == {"Bearer s3cret"}
    backend.close()


def test_a_server_that_keeps_failing_is_a_clear_error_after_the_retries():
    failing = FakeServer(num_failures=100)
    try:
        backend = RemoteTeacherBackend(RemoteConfig(url=failing.url, max_retries=1), TOKENIZER)
        with pytest.raises(RemoteTeacherError, match=r"failed a scoring request after 1 retries"):
            backend.score([ScoreRequest((5, 6), (7,))])
        assert failing.completions == 2
        backend.close()
    finally:
        failing.close()


def test_start_up_checks_name_the_problem():
    shifted = FakeServer(tokenize_shift=1)
    try:
        with pytest.raises(ValueError, match="tokenises differently from the student"):
            check_server(RemoteConfig(url=shifted.url), TOKENIZER)
        with pytest.raises(ValueError, match=r"served_model 'other' is not served .* \['teacher'\]"):
            check_server(RemoteConfig(url=shifted.url, served_model="other"), TOKENIZER)
        with pytest.raises(ValueError, match="api_key_env names 'NO_SUCH_KEY_VAR'"):
            check_server(RemoteConfig(url=shifted.url, api_key_env="NO_SUCH_KEY_VAR"), TOKENIZER)
    finally:
        shifted.close()
    with pytest.raises(ValueError, match="does not answer"):
        check_server(RemoteConfig(url=shifted.url, timeout_s=2), TOKENIZER)
    assert "<tool_call>" in PROBE and "<|im_start|>" in PROBE


def test_a_server_that_scored_other_tokens_is_an_error():
    from teacher.backends import scores_from_prompt_logprobs

    rows = [None, {7: (1, -0.5)}, {9: (1, -0.2)}]
    with pytest.raises(ValueError, match=r"lack the scored token at position\(s\) \[2\]"):
        scores_from_prompt_logprobs([5, 7, 8], rows, 2, top_k=0)


def test_preflight_refuses_a_prompt_budget_longer_than_the_remote_teachers_context(server):
    from jobs.config import load_config
    from jobs.train import JobConfig, preflight

    overrides = [f"teacher.remote.url={server.url}", "run.metrics_port=null"]
    config = load_config(JobConfig, "jobs/configs/babyai_opd_remote_tiny.yaml",
                         overrides + ["rollout.loop.max_context_tokens=1024"])
    with pytest.raises(ValueError, match=r"max_context_tokens \(1024\) is longer than the remote teacher's context "
                                         r"\(512 tokens\)"):
        preflight(config)
    preflight(load_config(JobConfig, "jobs/configs/babyai_opd_remote_tiny.yaml",
                          overrides + ["rollout.loop.max_context_tokens=512"]))


def test_a_server_with_another_tokenizer_scores_across_tokenizers():
    """teacher.cross_tokenizer with the remote backend: the server tokenises like teacher.model's
    tokenizer (nano384), not the student's (nano); the student's tokens get the mapped log-probs."""
    from teacher.builtin import _check_remote, _remote
    from teacher.registry import BuildContext
    from teacher.service import TeacherConfig
    from tests.unit.test_cross_tokenizer import conversation

    teacher_tok = load_tokenizer(ModelConfig(path="tiny:nano384"))
    other = FakeServer(tokenizer=teacher_tok)
    try:
        plain = TeacherConfig(backend="remote", remote=RemoteConfig(url=other.url))
        with pytest.raises(ValueError, match="teacher.cross_tokenizer=true"):
            _check_remote(plain, TOKENIZER)
        config = TeacherConfig(backend="remote", remote=RemoteConfig(url=other.url), cross_tokenizer=True,
                               model=ModelConfig(path="tiny:nano384"))
        assert _check_remote(config, TOKENIZER) == 512
        scorer = _remote(config, BuildContext(TOKENIZER, None, None))
        prompt_ids, response_ids = conversation(TOKENIZER, ["go to the red ball"])
        scored = scorer.backend.score([ScoreRequest(tuple(prompt_ids), tuple(response_ids))])[0].logprobs
        text = teacher_tok.encode("go to the red ball", add_special_tokens=False) + [teacher_tok.eos_token_id]
        prompt = teacher_tok.apply_chat_template(
            [{"role": "system", "content": "You are an agent in a grid world."},
             {"role": "user", "content": "Your task: go to the red ball."}], add_generation_prompt=True, tokenize=False)
        start = len(teacher_tok.encode(prompt, add_special_tokens=False))
        expected = sum(logprob(start + j, token) for j, token in enumerate(text))
        assert len(scored) == len(response_ids) and abs(sum(scored) - expected) < 1e-9
    finally:
        other.close()
