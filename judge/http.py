"""A judge model behind an OpenAI-compatible chat-completions API (the maintained `openai` client, async).

The judge reads the whole episode as the student saw it (the last turn's prompt and response,
decoded), the number of the turn to score and a rubric, and answers with its score in a fixed
tag, `<score>N</score>` with N from 0 to 10. The score is the last such tag in the answer
(reasoning may come first); an answer without one, or with N outside 0..10, is unparsed: the
request is retried, and after `max_retries` the turn gets the neutral score and is counted. A
request the server refuses as wrong (a 4xx other than RETRIED_CLIENT_ERRORS) is not retried and
not scored neutral: it raises JudgeRequestError, which fails the worker's run and names the status.
The API key is read from the environment variable `api_key_env` names, at start-up; it never
enters a config dump, a log line or a checkpoint.
"""

from __future__ import annotations

import asyncio
import os
import re

from pydantic import BaseModel, ConfigDict, Field

RUBRIC = (
    "Score the agent's action in the marked turn from 0 to 10: 10 when it is the best move toward "
    "completing the task from that state, 5 when it neither helps nor hurts, 0 when it moves away "
    "from the goal, repeats a useless action, or is not a valid tool call."
)

_SCORE = re.compile(r"<score>\s*([0-9]+(?:\.[0-9]+)?)\s*</score>", re.IGNORECASE)


class HttpJudgeConfig(BaseModel):
    """Where the judge model is served and how it is asked."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "judge"
    """The served model name."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key (None: no key, a local server)."""
    rubric: str = RUBRIC
    max_concurrency: int = Field(default=32, ge=1)
    """Requests in flight at once."""
    timeout_s: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=3, ge=0)
    """Retries of a failed or unparsed request (exponential backoff from `backoff_s`)."""
    backoff_s: float = Field(default=0.5, ge=0)
    max_tokens: int = Field(default=256, ge=8)
    """Room for the judge's answer (reasoning and the score tag)."""
    temperature: float = Field(default=0.0, ge=0)


def judge_messages(rubric: str, episode: str, turn: int, num_turns: int) -> list[dict[str, str]]:
    """The judge's chat: the rubric as system, the episode and the turn to score as user."""
    return [{"role": "system", "content": f"You are a strict judge of an agent's actions. {rubric} "
                                          f"End your answer with the score as <score>N</score>."},
            {"role": "user", "content": f"The agent's episode ({num_turns} turns, as the agent saw it):\n\n"
                                        f"{episode}\n\nScore turn {turn + 1} of {num_turns} "
                                        f"(the agent's {_ordinal(turn + 1)} response)."}]


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 < 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def parse_score(answer: str | None) -> float | None:
    """The last `<score>N</score>` as N/10 in [0, 1]; None when there is none or N is outside 0..10."""
    found = _SCORE.findall(answer or "")
    if not found:
        return None
    value = float(found[-1])
    return value / 10 if 0 <= value <= 10 else None


class JudgeAuthError(ValueError):
    """The judge server refused the API key (a config error, not a transient failure)."""


class JudgeRequestError(ValueError):
    """The judge server refused a request as malformed (a 4xx other than RETRIED_CLIENT_ERRORS):
    every retry would be refused the same way, so it fails the group instead of scoring it neutral."""


RETRIED_CLIENT_ERRORS = (408, 409, 429)
"""Client errors that say "try again" (timeout, conflict, rate limit) rather than "this request is wrong"."""


class HttpJudge:
    """Scores turns through the chat-completions API; must be used on one event loop."""

    def __init__(self, config: HttpJudgeConfig, tokenizer) -> None:
        from openai import AsyncOpenAI

        key = "EMPTY"
        if config.api_key_env is not None:
            key = os.environ.get(config.api_key_env, "")
            if not key:
                raise ValueError(f"judge.http.api_key_env: the environment variable {config.api_key_env} is not set")
        self.config = config
        self.tokenizer = tokenizer
        self.client = AsyncOpenAI(base_url=config.base_url, api_key=key, timeout=config.timeout_s, max_retries=0)
        self._slots = asyncio.Semaphore(config.max_concurrency)
        self._episode: tuple[tuple, str] | None = None

    async def check(self) -> None:
        """Fail fast: the server answers, knows the model, and accepts the key."""
        import openai

        try:
            models = [m.id async for m in self.client.models.list()]
        except openai.AuthenticationError as exc:
            raise JudgeAuthError(f"the judge server at {self.config.base_url} refused the API key from "
                                 f"${self.config.api_key_env}: {exc.message}") from None
        except openai.APIConnectionError as exc:
            raise ValueError(f"no judge server answers at {self.config.base_url}: {exc}") from None
        if self.config.model not in models:
            raise ValueError(f"judge.http.model {self.config.model!r} is not served at {self.config.base_url}; "
                             f"served: {models}")

    def episode_text(self, trajectory) -> str:
        """The decoded episode; the selected turns of one trajectory are asked for together, so the
        last trajectory's text is kept instead of decoding it once per turn."""
        last = trajectory.turns[-1]
        key = (trajectory.trajectory_id, last.prompt_ids, last.response_ids)  # a re-run episode keeps its id
        if self._episode is None or self._episode[0] != key:
            text = self.tokenizer.decode(list(last.prompt_ids) + list(last.response_ids), skip_special_tokens=False)
            self._episode = (key, text)
        return self._episode[1]

    async def score(self, trajectory, turn: int) -> float | None:
        """The judge's score of `turn` in [0, 1]; None after every retry failed or went unparsed."""
        import openai

        steps = trajectory.env_steps()  # the decoded episode shows actions only (a memory turn is judged by its action)
        messages = judge_messages(self.config.rubric, self.episode_text(trajectory), steps[turn], steps[-1] + 1)
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                await asyncio.sleep(self.config.backoff_s * 2 ** (attempt - 1))
            try:
                async with self._slots:
                    reply = await self.client.chat.completions.create(
                        model=self.config.model, messages=messages, max_tokens=self.config.max_tokens,
                        temperature=self.config.temperature)
            except openai.AuthenticationError as exc:
                raise JudgeAuthError(f"the judge server refused the API key: {exc.message}") from None
            except openai.APIStatusError as exc:
                if 400 <= exc.status_code < 500 and exc.status_code not in RETRIED_CLIENT_ERRORS:
                    raise JudgeRequestError(f"the judge server at {self.config.base_url} refused the request with "
                                            f"{exc.status_code}: {exc.message} (retrying would get the same answer: "
                                            f"check judge.http.model, max_tokens and the server's limits)") from None
                continue
            except (openai.APIConnectionError, openai.APITimeoutError):
                continue
            score = parse_score(reply.choices[0].message.content if reply.choices else None)
            if score is not None:
                return score
        return None

    async def close(self) -> None:
        await self.client.close()
