"""A teacher behind an OpenAI-compatible HTTP server that serves prompt log-probs (vLLM's).

Each ScoreRequest is one `/v1/completions` call: the prompt is the token ids of teacher prompt +
student response, `max_tokens=1`, `prompt_logprobs=k` (vLLM's extension: per prompt position
the actual token and the top-k with their ranks). Calls run concurrently on one event loop
(the maintained `openai` client, async), at most `max_concurrency` at a time; each has a
timeout, and the client retries connection errors, 429 and 5xx with exponential backoff. A
request that still fails raises `RemoteTeacherError`: the teacher service fails that batch's
callers, so no group is stored half-scored (the rollout worker's delivery fails, the pool
restarts it and the group re-runs).

The student's token ids go to the server unchanged, so both must use one tokenizer:
`check_server` compares the server's `/tokenize` with the student tokenizer on a probe of the
chat and tool-call markup, once at start-up (preflight and the teacher actor).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import urllib.request

from pydantic import BaseModel, ConfigDict, Field

from teacher.backends import ScoreRequest, TokenScores, scores_from_prompt_logprobs

PROBE = ('<|im_start|>user\nGo to the red ball. 3 steps ahead.<|im_end|>\n<|im_start|>assistant\n<tool_call>\n'
         '{"name": "go_forward", "arguments": {}}\n</tool_call><|im_end|>\n')
"""Text whose token ids the server and the student tokenizer must agree on."""


class RemoteTeacherError(RuntimeError):
    """The server did not answer a scoring request after its retries."""


class RemoteConfig(BaseModel):
    """Where the teacher is served and how it is called."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = "http://127.0.0.1:8001/v1"
    """Base URL of the OpenAI-compatible API (ends in /v1)."""
    served_model: str | None = None
    """The model name the server knows; None: the server's only model."""
    api_key_env: str | None = None
    """Environment variable holding the API key (the key itself never enters a config or a log)."""
    max_concurrency: int = Field(default=32, ge=1)
    timeout_s: float = Field(default=60.0, gt=0)
    """Per request."""
    max_retries: int = Field(default=3, ge=0)
    """Retries of a failed request (exponential backoff from 0.5 s), then RemoteTeacherError."""


def _server_root(url: str) -> str:
    return url.rstrip("/").removesuffix("/v1")


def _get_json(url: str, payload: dict | None, config: RemoteConfig) -> dict:
    headers = {"Content-Type": "application/json"}
    if config.api_key_env:
        headers["Authorization"] = f"Bearer {os.environ[config.api_key_env]}"
    data = None if payload is None else json.dumps(payload).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers),
                                timeout=config.timeout_s) as response:
        return json.loads(response.read())


def check_server(config: RemoteConfig, tokenizer, whose: str = "student") -> tuple[str, int]:
    """(served model name, its max_model_len) after checking that the server answers and
    tokenises like `tokenizer` (the student's; with teacher.cross_tokenizer, the teacher's own);
    ValueError naming the problem otherwise."""
    if config.api_key_env and config.api_key_env not in os.environ:
        raise ValueError(f"teacher.remote.api_key_env names {config.api_key_env!r}, which is not set")
    try:
        models = _get_json(f"{config.url.rstrip('/')}/models", None, config)["data"]
    except OSError as exc:
        raise ValueError(f"teacher.remote.url {config.url}: the server does not answer ({exc}); start it "
                         f"(python -m models.vllm_server) or fix the URL") from exc
    names = [m["id"] for m in models]
    if config.served_model is None and len(names) != 1:
        raise ValueError(f"the server at {config.url} serves {names}: set teacher.remote.served_model")
    name = config.served_model or names[0]
    if name not in names:
        raise ValueError(f"teacher.remote.served_model {name!r} is not served at {config.url} (it serves {names})")
    max_len = next(m.get("max_model_len") for m in models if m["id"] == name)
    served = _get_json(f"{_server_root(config.url)}/tokenize",
                       {"model": name, "prompt": PROBE, "add_special_tokens": False}, config)["tokens"]
    ours = tokenizer(PROBE, add_special_tokens=False)["input_ids"]
    if served != ours:
        first = next((i for i, (a, b) in enumerate(zip(served, ours)) if a != b), min(len(served), len(ours)))
        hint = ("OPD scores the student's exact tokens: serve a teacher with the student's tokenizer, or set "
                "teacher.cross_tokenizer=true and teacher.model to the served model's tokenizer"
                if whose == "student" else "teacher.model must name the served model's tokenizer")
        raise ValueError(f"the teacher served at {config.url} ({name}) tokenises differently from the {whose}: "
                         f"the probe gives {len(served)} vs {len(ours)} ids, first difference at id {first} "
                         f"(server {served[first:first + 3]}, {whose} {ours[first:first + 3]}); {hint}")
    return name, int(max_len or 0)


class RemoteTeacherBackend:
    """TeacherBackend over HTTP; its event loop runs on a thread of its own, so `score` can be
    called from any thread (the teacher service calls it from an executor)."""

    def __init__(self, config: RemoteConfig, tokenizer, whose: str = "student") -> None:
        """`tokenizer`: the one the server must tokenise like (`check_server`), whose ids it scores."""
        from openai import AsyncOpenAI

        self.config = config
        self.model, self.max_model_len = check_server(config, tokenizer, whose)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="remote-teacher", daemon=True)
        self._thread.start()
        api_key = os.environ[config.api_key_env] if config.api_key_env else "unused"

        async def make_client():
            return AsyncOpenAI(base_url=config.url, api_key=api_key, timeout=config.timeout_s,
                               max_retries=config.max_retries), asyncio.Semaphore(config.max_concurrency)

        self._client, self._slots = self._run(make_client())
        self.num_requests = 0

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def score(self, requests: list[ScoreRequest], top_k: int = 0) -> list[TokenScores]:
        return self._run(self._score_all(requests, top_k))

    async def _score_all(self, requests: list[ScoreRequest], top_k: int) -> list[TokenScores]:
        return list(await asyncio.gather(*(self._score_one(r, top_k) for r in requests)))

    async def _score_one(self, request: ScoreRequest, top_k: int) -> TokenScores:
        from openai import OpenAIError

        ids = list(request.prompt_ids) + list(request.response_ids)
        if self.max_model_len and len(ids) >= self.max_model_len:
            raise ValueError(f"a scoring request of {len(ids)} tokens does not fit the served teacher's "
                             f"max_model_len {self.max_model_len}")
        async with self._slots:
            self.num_requests += 1
            try:
                completion = await self._client.completions.create(
                    model=self.model, prompt=ids, max_tokens=1, temperature=1.0,
                    extra_body={"prompt_logprobs": top_k})
            except OpenAIError as exc:
                raise RemoteTeacherError(f"teacher at {self.config.url} failed a scoring request after "
                                         f"{self.config.max_retries} retries: {type(exc).__name__}: {exc}") from exc
        rows = completion.choices[0].model_extra["prompt_logprobs"]
        return scores_from_prompt_logprobs(
            ids, [None if row is None else {int(t): (v["rank"], float(v["logprob"])) for t, v in row.items()}
                  for row in rows], len(request.response_ids), top_k)

    def close(self) -> None:
        self._run(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
