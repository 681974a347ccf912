"""A judge model behind an OpenAI-compatible chat-completions API (the maintained `openai` client, async).

The judge reads the whole episode with its outcome, as document 000's judge does: the task and
first observation (the first turn's prompt), then each turn's responses and the environment's
answer, then how the episode ended; it scores the marked turn's thinking, plan and action
against a rubric, and answers with its score in a fixed tag, `<score>N</score>` with N from 0 to
10. An episode longer than `max_episode_tokens` loses turns from its middle, never the task,
the judged turn or the outcome (`episode_view`). The score is the last such tag in the answer
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
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

RUBRIC = (
    "Read the whole episode, including how it ended, then score the marked turn from 0 to 10 on its "
    "thinking, its plan and its action: is its reading of the environment and the tools correct, is "
    "its plan sound, and is its action the right move toward completing the task from that state? "
    "10 when all three are right and the action is the best move; 5 when the action neither helps nor "
    "hurts; 0 when the turn misreads the situation, moves away from the goal, repeats a useless "
    "action, or is not a valid tool call. Judge the turn by what it could know at the time; the "
    "outcome only tells you whether the episode's path worked."
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
    max_episode_tokens: int = Field(default=12288, ge=256)
    """Budget of the episode text in the judge's prompt (tokens of the student's tokenizer); a
    longer episode loses turns from its middle. A judge the job serves itself gets at most its
    context less `max_tokens` and 512 for the rubric."""


def judge_messages(rubric: str, episode: str, turn: int, num_turns: int) -> list[dict[str, str]]:
    """The judge's chat: the rubric as system, the episode and the turn to score as user."""
    return [{"role": "system", "content": f"You are a strict judge of an agent's actions. {rubric} "
                                          f"End your answer with the score as <score>N</score>."},
            {"role": "user", "content": f"The agent's episode ({num_turns} turns):\n\n"
                                        f"{episode}\n\nScore turn {turn + 1} of {num_turns} "
                                        f"(the agent's {_ordinal(turn + 1)} turn, marked {JUDGED})."}]


JUDGED = "<<< THE TURN TO SCORE >>>"
_IM_START, _IM_END = "<|im_start|>", "<|im_end|>"


def last_message(prompt: str) -> str:
    """The content of the last message of a rendered chat prompt (before its generation prompt):
    what the agent had just been shown, a tool's answer or, at the first turn, the task."""
    body = prompt.rsplit(f"{_IM_START}assistant", 1)[0]
    content = body.rsplit(_IM_START, 1)[-1].partition("\n")[2].replace(_IM_END, "").strip()
    # Qwen3 renders a tool's answer as a user turn wrapped in <tool_response> tags.
    return content.removeprefix("<tool_response>").removesuffix("</tool_response>").strip()


@dataclass(frozen=True)
class EpisodeParts:
    """An episode cut into what the judge reads, with each part's token count."""

    head: tuple[str, int]
    """The first turn's prompt: the system turn (tools), the task and the first observation."""
    steps: tuple[tuple[str, int], ...]
    """Per environment step: the agent's responses (memory and action) and the answer shown next."""
    outcome: tuple[str, int]


def episode_parts(trajectory, tokenizer) -> EpisodeParts:
    def part(text: str) -> tuple[str, int]:
        return text, len(tokenizer.encode(text, add_special_tokens=False))

    turns, steps = trajectory.turns, trajectory.env_steps()
    first = tokenizer.decode(list(turns[0].prompt_ids), skip_special_tokens=False)
    texts: list[list[str]] = [[] for _ in range(steps[-1] + 1)]
    for k, (step, turn) in enumerate(zip(steps, turns)):
        response = tokenizer.decode(list(turn.response_ids), skip_special_tokens=False).replace(_IM_END, "").strip()
        texts[step].append(f"Agent ({turn.stage}): {response}")
        if turn.stage == "action" and k + 1 < len(turns):
            shown = last_message(tokenizer.decode(list(turns[k + 1].prompt_ids), skip_special_tokens=False))
            texts[step].append(f"Environment: {shown}")
    ended = "succeeded" if trajectory.success else "failed"
    outcome = (f"Outcome: the episode {ended} after {len(texts)} turns (outcome reward "
               f"{trajectory.outcome_reward:+g}).")
    return EpisodeParts(part(f"Task and first observation, as the agent saw them:\n{first.strip()}"),
                        tuple(part("\n".join(t)) for t in texts), part(outcome))


def episode_view(parts: EpisodeParts, judged: int, budget: int) -> str:
    """The episode as the judge reads it, marking step `judged`: within `budget` tokens, turns are
    dropped from the middle (kept from both ends inward), never the task, the judged step or the
    outcome; a gap says how many turns it hides."""
    n = len(parts.steps)
    kept = {judged}
    used = parts.head[1] + parts.outcome[1] + parts.steps[judged][1]
    ends = [i for pair in zip(range(n), range(n - 1, -1, -1)) for i in pair]
    for i in dict.fromkeys(ends):  # 0, n-1, 1, n-2, ...: from both ends toward the middle
        if i not in kept and used + parts.steps[i][1] <= budget:
            kept.add(i)
            used += parts.steps[i][1]
        elif i not in kept:
            break
    lines, gap = [parts.head[0]], 0
    for i in range(n):
        if i not in kept:
            gap += 1
            continue
        if gap:
            lines.append(f"[... {gap} turn(s) omitted ...]")
            gap = 0
        marker = f" {JUDGED}" if i == judged else ""
        lines.append(f"--- Turn {i + 1}{marker} ---\n{parts.steps[i][0]}")
    if gap:
        lines.append(f"[... {gap} turn(s) omitted ...]")
    lines.append(parts.outcome[0])
    return "\n\n".join(lines)


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
        self._episode: tuple[tuple, EpisodeParts] | None = None

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

    def episode_text(self, trajectory, step: int) -> str:
        """The episode as the judge reads it, step `step` marked. The selected turns of one
        trajectory are asked for together, so its parts are kept instead of decoded per turn."""
        last = trajectory.turns[-1]
        key = (trajectory.trajectory_id, last.prompt_ids, last.response_ids)  # a re-run episode keeps its id
        if self._episode is None or self._episode[0] != key:
            self._episode = (key, episode_parts(trajectory, self.tokenizer))
        return episode_view(self._episode[1], step, self.config.max_episode_tokens)

    async def score(self, trajectory, turn: int) -> float | None:
        """The judge's score of `turn` in [0, 1]; None after every retry failed or went unparsed."""
        import openai

        steps = trajectory.env_steps()  # a memory turn is judged with its step's action
        messages = judge_messages(self.config.rubric, self.episode_text(trajectory, steps[turn]), steps[turn],
                                  steps[-1] + 1)
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
