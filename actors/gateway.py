"""The agent gateway: an OpenAI-compatible endpoint in front of a rollout worker's engine (docs/gateway.md).

`GatewayRunner` plays the `gateway` environment's episodes (envs/gateway.py) with the interface
of the built-in loop (`actors.agent_loop.EpisodeRunner`), so the worker's groups, staleness,
segments, teacher scoring and every algorithm run unchanged. Each episode is a session: the
user's program, started by the runner, calls the endpoint and ends the session with a reward.

    program --POST .../chat/completions--> HTTP thread --queue--> step(): the calls that are in
       ^                                     (waits)                 generate together; calls that
       |                                                             come meanwhile join the batch;
       +---------- chat.completion (tool_calls) <------------------- a Turn recorded per call
    program --POST /v1/sessions/{id}/reward--> step() ends the session: EpisodeResult -> the group

Token in, token out: a call whose messages continue an earlier call of its session (that call's
messages and tools, then the reply it got) is prompted with that call's prompt ids, its response
ids as generated and the tokens the chat template adds after them, as the built-in loop does --
never a re-tokenisation of generated text (a template that drops `<think>` from history changes
nothing). Any other call starts a new branch: its prompt is rendered from its own messages and
counted (`num_branches`); the buffer trains such turns as separate sequences (buffer.expansion).

Sampling is the job's (`rollout.sampling`, greedy in evaluations): a request's temperature and
top_p are ignored, its max_tokens can only lower the budget, so every recorded log-prob is the
behaviour policy's. The endpoint binds `env.host` (127.0.0.1 by default).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from actors.agent_loop import AGENT_FAILED, EpisodeResult, EpisodeState, EpisodeTask, LoopConfig, finish_episode, template_tail
from actors.engine import stream_generations
from buffer.contracts import Turn, are_logprobs
from envs.gateway import GatewayConfig, GatewayEnv
from envs.parser import ToolCallParser
from envs.prompt import HistoryTurn
from envs.protocol import TextEnv

POLL_S = 0.05
"""Longest a round waits for a first call, so the worker's loop keeps turning (weights, stop)."""


@dataclass(frozen=True)
class Session:
    """What a session's program is given (a command gets the same as environment variables)."""

    session_id: str
    base_url: str
    """This session's OpenAI base URL (`.../sessions/{id}/v1`): a stock client needs nothing else."""
    gateway_url: str
    """The endpoint's root: `POST {gateway_url}/v1/sessions/{id}/reward` ends the session."""
    api_key: str
    """The bearer key calls must carry ('' when none is asked)."""
    task: dict[str, Any]
    """split, seed, task (the instruction), task_type, max_turns, env (the task environment's config)."""


class GatewayError(Exception):
    """A refused call: its HTTP status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class _Call:
    """A chat completion waiting for its round."""

    body: dict[str, Any]
    done: threading.Event = field(default_factory=threading.Event)
    status: int = 200
    answer: dict[str, Any] | None = None

    def reply(self, status: int, answer: dict[str, Any]) -> None:
        self.status, self.answer = status, answer
        self.done.set()


@dataclass
class _Recorded:
    """An answered call, for the prefix rule."""

    messages: list
    """The request's messages, normalised (`_norm`)."""
    tools: Any
    reply: dict[str, Any]
    """The assistant message returned."""
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    closed: bool
    """Whether the response ended with the end-of-turn token (else the prefix adds it)."""


@dataclass
class _Program:
    """A running `env.command`: one session's, or a slot's persistent one (`env.persistent`)."""

    process: subprocess.Popen
    log: Any
    """Its stdout and stderr (a temporary file), for the error of a session it failed."""
    slot: int | None = None
    """The slot a persistent program serves; None: one session's program."""
    session: "_Open | None" = None
    """The session it is running (a persistent program: the one sent last, until it ends)."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def start(cls, command: str, variables: dict[str, str], slot: int | None = None) -> "_Program":
        # The worker's interpreter first on PATH: `python` in a command is the job's environment.
        path = f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"
        log = tempfile.TemporaryFile()
        process = subprocess.Popen(command, shell=True, env={**os.environ, **variables, "PATH": path},
                                   stdin=subprocess.DEVNULL if slot is None else subprocess.PIPE, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        return cls(process, log, slot)

    def exit_text(self) -> str:
        self.log.seek(0)
        tail = self.log.read().decode(errors="replace").strip().splitlines()[-20:]
        return f"the program exited with status {self.process.returncode} without posting a reward" + \
            ("; its last output:\n" + "\n".join(tail) if tail else "")

    def kill(self) -> None:
        """Kill its whole process group, if it still runs; close its log. Once: the runner's close
        and the program's watcher (a persistent program dying between sessions) may both call it."""
        with self.lock:
            if self.log.closed:
                return
            if self.process.poll() is None:
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except ProcessLookupError:  # exited between the poll and the kill
                    pass
                self.process.wait()
            if self.process.stdin is not None:
                self.process.stdin.close()
            self.log.close()


@dataclass
class _Open:
    """A session whose episode is running."""

    ep: EpisodeState
    session: Session
    deadline: float
    calls: list[_Recorded] = field(default_factory=list)
    queued: list[_Call] = field(default_factory=list)
    outcome: tuple[bool, float | None] | None = None
    """(success, score) once the program posted its reward."""
    ended: str | None = None
    """Why the session ended without a reward (the result's `truncated`): 'max_turns', 'context' or
    AGENT_FAILED (`error` says how)."""
    exited: bool = False
    """Its program is gone (a command exited, a callable returned or raised)."""
    program: _Program | None = None
    """The command running it (None: a callable)."""
    error: str = ""

    @property
    def over(self) -> bool:
        return self.outcome is not None or self.ended is not None


class GatewayRunner:
    """Sessions in flight over `num_slots` slots, each run by the user's program (see module docstring)."""

    def __init__(self, make_env: Callable[[], TextEnv], num_slots: int, config: LoopConfig) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.config = config
        self._envs = [make_env() for _ in range(num_slots)]
        if not isinstance(self._envs[0], GatewayEnv):
            raise ValueError("the gateway runner plays env.name=gateway in-process (rollout.env_actors=false)")
        self.gateway: GatewayConfig = self._envs[0].config
        self._parser = ToolCallParser(self._envs[0].tools, config.parser_mode)
        self._free = list(range(num_slots))[::-1]
        self._open: dict[str, _Open] = {}
        self._lingering: list[_Open] = []
        """Sessions that ended while their own program still ran: killed at their deadline or close()."""
        self._persistent: dict[int, _Program] = {}
        """With `env.persistent`: each slot's running program."""
        self._cond = threading.Condition()
        self.num_env_restarts = 0  # the runner's interface: programs are not restarted
        self.num_branches = 0
        """Calls (after a session's first) that did not continue an earlier call of their session."""
        self._last_generate_s = 0.0
        self.api_key = secrets.token_urlsafe(24) if self.gateway.api_key == "auto" else (self.gateway.api_key or "")
        self._server = ThreadingHTTPServer((self.gateway.host, self.gateway.port), _Handler)
        self._server.daemon_threads = True
        self._server.gateway = self
        host, port = self._server.server_address[:2]
        self.url = f"http://{host}:{port}"
        threading.Thread(target=self._server.serve_forever, name="gateway-http", daemon=True).start()

    # -- the runner interface (actors.agent_loop.EpisodeRunner) ------------------------------------

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_active(self) -> int:
        return len(self._open)

    @property
    def running(self) -> list[EpisodeState]:
        return [s.ep for s in self._open.values()]

    def start(self, task: EpisodeTask, tag: Any = None) -> None:
        self.start_many([(task, tag)])

    def start_many(self, tasks: list[tuple[EpisodeTask, Any]]) -> None:
        """Start a session (and its program) per (task, tag) in a free slot."""
        if len(tasks) > len(self._free):
            raise RuntimeError(f"{len(tasks)} tasks for {len(self._free)} free slots")
        for task, tag in tasks:
            slot = self._free.pop()
            env = self._envs[slot]
            reset = env.reset(task.seed, task.split)
            session_id = uuid.uuid4().hex
            session = Session(session_id, f"{self.url}/sessions/{session_id}/v1", self.url, self.api_key,
                              {"split": task.split, "seed": task.seed, "task": reset.task,
                               "task_type": reset.info.task_type, "max_turns": task.max_turns or self.config.max_turns,
                               "env": self.gateway.tasks.model_dump(mode="json")})
            state = _Open(EpisodeState(slot=slot, task=task, env=env, reset=reset, tag=tag), session,
                          time.monotonic() + self.gateway.session_timeout_s)
            with self._cond:
                self._open[session_id] = state
            self._launch(state)

    def step(self, policy) -> list[tuple[Any, EpisodeResult]]:
        """One round: answer every call that is in, and the other running sessions' calls as they
        arrive while the engine generates (one call per session per round, so a round ends), then
        end the sessions that are over; returns (tag, result) of those."""
        calls = self._take_calls()
        if calls:
            self._answer(calls, policy)
        return self._reap()

    def close(self) -> None:
        """Stop the endpoint; kill the programs still running (a callable's thread cannot be killed:
        its later calls are refused)."""
        self._server.shutdown()
        self._server.server_close()
        with self._cond:
            programs = [s.program for s in list(self._open.values()) + self._lingering if s.program is not None]
            programs += self._persistent.values()
            self._persistent = {}
            for state in self._open.values():
                state.ended = state.ended or AGENT_FAILED
                for call in state.queued:
                    call.reply(*_error(410, "the gateway closed"))
        for program in {id(p): p for p in programs}.values():  # a persistent one may appear twice
            program.kill()

    # -- programs -----------------------------------------------------------------------------------

    def _launch(self, state: _Open) -> None:
        s = state.session
        if self.gateway.callable is not None:
            module, name = self.gateway.callable.split(":", 1)
            function = getattr(importlib.import_module(module), name)

            def run():
                try:
                    function(s)
                except BaseException:  # the program's own failure: its session ends with it
                    state.error = traceback.format_exc()
                with self._cond:
                    state.exited = True
                    self._cond.notify_all()

            threading.Thread(target=run, name=f"gateway-{s.session_id[:8]}", daemon=True).start()
        elif not self.gateway.persistent:
            state.program = _Program.start(self.gateway.command, {
                "OPENAI_BASE_URL": s.base_url, "OPENAI_API_KEY": s.api_key or "none",
                "APPRENTICE_GATEWAY_URL": s.gateway_url, "APPRENTICE_SESSION_ID": s.session_id,
                "APPRENTICE_TASK": json.dumps(s.task)})
            state.program.session = state
            self._watch(state.program)
        else:
            program = self._persistent.get(state.ep.slot)
            if program is None:
                program = self._persistent[state.ep.slot] = _Program.start(self.gateway.command, {
                    "OPENAI_API_KEY": s.api_key or "none", "APPRENTICE_GATEWAY_URL": s.gateway_url}, state.ep.slot)
                self._watch(program)
            with self._cond:
                program.session, state.program = state, program
            try:
                program.process.stdin.write((json.dumps(dataclasses.asdict(s)) + "\n").encode())
                program.process.stdin.flush()
            except BrokenPipeError:  # it died since its last session
                with self._cond:
                    state.exited = True

    def _watch(self, program: _Program) -> None:
        """When the program exits, the session it was running (if any is still open) has no program."""
        def wait():
            program.process.wait()
            with self._cond:
                if program.session is not None:
                    program.session.exited = True  # its session's end releases the program
                elif program.slot is not None:
                    program.kill()  # a persistent program that died between sessions: only its log is left
                if self._persistent.get(program.slot) is program:
                    del self._persistent[program.slot]  # the slot's next session starts another
                self._cond.notify_all()

        threading.Thread(target=wait, name="gateway-program", daemon=True).start()

    def _release(self, state: _Open) -> _Program | None:
        """Detach an ended session from its program; the program to kill and clean up, if it must go
        (it exited, or its session failed: a persistent one is restarted for the slot's next)."""
        program = state.program
        if program is None:
            return None
        program.session = None
        if state.ended != AGENT_FAILED:
            if program.slot is not None:
                return None  # it reads the slot's next session
            if program.process.poll() is None:
                program.session = state  # still running after its reward: killed at its deadline
                self._lingering.append(state)
                return None
        if self._persistent.get(program.slot) is program:
            del self._persistent[program.slot]
        return program

    def _reap(self) -> list[tuple[Any, EpisodeResult]]:
        now = time.monotonic()
        finished, kill = [], []
        with self._cond:
            for sid, state in list(self._open.items()):
                if not state.over and state.exited:
                    state.ended = AGENT_FAILED
                    state.error = state.error or (state.program.exit_text() if state.program is not None else
                                                  "the callable returned without posting a reward")
                elif not state.over and now > state.deadline:
                    state.ended = AGENT_FAILED
                    state.error = f"timed out: no reward within env.session_timeout_s={self.gateway.session_timeout_s:g}"
                if not state.over:
                    continue
                del self._open[sid]
                for call in state.queued:
                    call.reply(*_error(410, f"session {sid} ended"))
                state.queued.clear()
                if state.ended == AGENT_FAILED:
                    print(f"gateway session {sid} (task {state.ep.task.split}:{state.ep.task.seed}) failed: "
                          f"{state.error.strip()}", flush=True)
                kill.append(self._release(state))
                finished.append(state)
            done = [s for s in self._lingering if s.exited or now > s.deadline]
            self._lingering = [s for s in self._lingering if s not in done]
            kill += [s.program for s in done]
        for program in kill:
            if program is not None:
                program.kill()
        results = []
        for state in finished:
            ep = state.ep
            ep.success, ep.score = state.outcome if state.outcome is not None else (False, None)
            # A failure posted after the last allowed call reads as the built-in loop's cut at max_turns.
            limit = ep.task.max_turns or self.config.max_turns
            ep.truncated = state.ended or ("max_turns" if not ep.success and len(ep.turns) >= limit else None)
            self._free.append(ep.slot)
            results.append((ep.tag, finish_episode(ep, self.config.rewards)))
        return results

    # -- calls ---------------------------------------------------------------------------------------

    def _take_calls(self) -> list[tuple[_Open, _Call]]:
        """The calls that are in, once one is (at most POLL_S), after the others' next calls: until
        every running session has one in, or none came for `batch_window_s` (the rest are busy),
        and at most as long as the last generation took (waiting longer costs more than it saves)."""
        with self._cond:
            def queued():
                return [(s, c) for s in self._open.values() for c in s.queued]

            def all_in():
                return all(s.queued or s.over or s.exited for s in self._open.values())

            self._cond.wait_for(lambda: queued() or any(s.over or s.exited for s in self._open.values()),
                                timeout=POLL_S)
            window = self.gateway.batch_window_s
            deadline = time.monotonic() + max(window, self._last_generate_s)
            while queued() and window and not all_in() and time.monotonic() < deadline:
                count = len(queued())
                self._cond.wait_for(lambda: len(queued()) > count or all_in(),
                                    timeout=min(window, deadline - time.monotonic()))
                if len(queued()) == count:
                    break
            calls = queued()
            for state, _ in calls:
                state.queued.clear()
        return calls

    def _answer(self, calls: list[tuple[_Open, _Call]], policy) -> None:
        """Generate for `calls`; a call of another session arriving meanwhile joins the running
        generation (continuous batching where the engine has it: `actors.engine.stream_generations`)."""
        tokenizer, stop_id, stop_token = policy.tokenizer, policy.prompter.stop_id, policy.prompter.stop_token
        version = policy.engine.version
        answered = {id(state) for state, _ in calls}
        first = [calls]

        def admit() -> list:
            new = first.pop() if first else self._late_calls(answered)
            requests = []
            for state, call in new:
                try:
                    prompt, messages, tools = self._prompt(state, call.body, tokenizer, stop_id, stop_token)
                    budget = self._budget(state, call.body, len(prompt), policy.sampling.max_new_tokens)
                except GatewayError as e:
                    call.reply(*_error(e.status, str(e)))
                    continue
                sampling = policy.sampling.model_copy(update={"max_new_tokens": budget})
                requests.append(((state, call, prompt, messages, tools), prompt, sampling))
            return requests

        start = time.monotonic()
        for (state, call, prompt, messages, tools), g in stream_generations(policy.engine, admit):
            reply, finish = self._record(state, prompt, messages, tools, g, version, tokenizer, stop_id)
            call.reply(200, _completion(call.body, reply, finish, len(prompt), len(g.token_ids)))
        self._last_generate_s = time.monotonic() - start

    def _late_calls(self, answered: set[int]) -> list[tuple[_Open, _Call]]:
        """The calls now in from sessions not yet answered this round (added to `answered`)."""
        with self._cond:
            late = [(s, c) for s in self._open.values() if id(s) not in answered for c in s.queued]
            for state, _ in late:
                answered.add(id(state))
                state.queued.clear()
        return late

    def _budget(self, state: _Open, body: dict, prompt_len: int, max_new_tokens: int) -> int:
        """The response's token budget; a call past the turn limit or the context ends its session."""
        limit = state.ep.task.max_turns or self.config.max_turns
        if len(state.ep.turns) >= limit:
            state.ended = "max_turns"
            raise GatewayError(400, f"the session's turn limit ({limit} calls) is reached")
        room = self.config.max_context_tokens - prompt_len
        if room < 1:
            state.ended = "context"
            raise GatewayError(400, f"the prompt ({prompt_len} tokens) leaves no room within "
                                    f"rollout.loop.max_context_tokens={self.config.max_context_tokens}")
        asked = body.get("max_completion_tokens") or body.get("max_tokens") or max_new_tokens
        if not isinstance(asked, int) or asked < 1:
            raise GatewayError(400, f"max_tokens must be a positive integer, got {asked!r}")
        return min(asked, max_new_tokens, room)

    def _prompt(self, state: _Open, body: dict, tokenizer, stop_id: int, stop_token: str):
        """(prompt ids, normalised messages, tools) of a call: an earlier call of the session
        continued token for token, or a new branch rendered from the messages."""
        messages, tools = body["messages"], body.get("tools") or None
        norm = [_norm(m) for m in messages]
        template = [_template_message(m) for m in messages]

        def render(ms, generation_prompt, tokenize):
            try:
                return tokenizer.apply_chat_template(ms, tools=tools, add_generation_prompt=generation_prompt,
                                                     tokenize=tokenize, return_dict=False)
            except Exception as e:  # the template's own check of the messages (roles, order)
                raise GatewayError(400, f"the chat template refused these messages: {e}") from e

        for past in reversed(state.calls):
            n = len(past.messages)
            if len(norm) > n + 1 and norm[:n] == past.messages and past.tools == tools \
                    and _echoes(past.reply, messages[n]):
                tail = template_tail(render(template[:n + 1], False, False), render(template, True, False), stop_token)
                if tail is not None:
                    closed = past.response_ids if past.closed else past.response_ids + (stop_id,)
                    ids = list(past.prompt_ids + closed) + tokenizer.encode(tail, add_special_tokens=False)
                    return ids, norm, tools
        if state.calls:
            self.num_branches += 1
        return list(render(template, True, True)), norm, tools

    def _record(self, state: _Open, prompt, messages, tools, g, version: int, tokenizer, stop_id: int):
        """The generation as the session's next turn; returns (the assistant message, finish_reason)."""
        ep = state.ep
        text = tokenizer.decode(g.token_ids, skip_special_tokens=True)
        parser = self._parser if tools is None else ToolCallParser(tools, self.config.parser_mode)
        parsed = parser.parse(text)
        finite = are_logprobs(g.logprobs)
        call = None if parsed.call is None else {"name": parsed.call.name, "arguments": parsed.call.arguments}
        ep.turns.append(Turn(turn_index=len(ep.turns), prompt_ids=tuple(prompt), response_ids=g.token_ids,
                             behaviour_logprobs=g.logprobs if finite else (0.0,) * len(g.logprobs),
                             policy_version=version, well_formed=parsed.well_formed, trainable=finite,
                             finish_reason=g.finish_reason, executed_call=None if call is None else json.dumps(call)))
        ep.well_formed.append(parsed.well_formed)
        ep.history.append(HistoryTurn(response_text=text, call=parsed.call, error=parsed.error, think=parsed.think,
                                      observation=""))
        reply: dict[str, Any] = {"role": "assistant", "content": "" if parsed.well_formed else text}
        if call is not None:
            reply["tool_calls"] = [{"id": f"call_{ep.task.trajectory_id}_{len(ep.turns)}", "type": "function",
                                    "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}]
        if parsed.think is not None:
            reply["reasoning_content"] = parsed.think
        if parsed.error is not None:
            reply["format_error"] = {"reason": parsed.error.reason.value, "detail": parsed.error.detail}
        state.calls.append(_Recorded(messages, tools, reply, tuple(prompt), g.token_ids,
                                     closed=bool(g.token_ids) and g.token_ids[-1] == stop_id))
        finish = "length" if g.finish_reason == "length" else ("tool_calls" if call is not None else "stop")
        return reply, finish

    # -- HTTP (handler threads) ------------------------------------------------------------------

    def handle(self, path: str, headers, body: Any) -> tuple[int, dict[str, Any]]:
        """(status, JSON answer) of a POST."""
        if self.api_key and headers.get("Authorization", "") != f"Bearer {self.api_key}":
            return _error(401, "missing or wrong API key (Authorization: Bearer <key>)")
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object")
        reward = re.fullmatch(r"/v1/sessions/([^/]+)/reward", path)
        if reward:
            return self._post_reward(reward.group(1), body)
        chat = re.fullmatch(r"(?:/sessions/([^/]+))?/v1/chat/completions", path)
        if chat is None:
            return _error(404, f"no route {path}")
        session_id = chat.group(1) or headers.get("X-Session-Id") or body.get("user")
        try:
            call = self._enqueue(session_id, body)
        except GatewayError as e:
            return _error(e.status, str(e))
        if not call.done.wait(timeout=self.gateway.session_timeout_s + 10):
            return _error(504, "no answer in time")
        return call.status, call.answer

    def _session(self, session_id: str | None) -> _Open:
        if not session_id:
            raise GatewayError(400, "no session: use the session's base URL, an X-Session-Id header or `user`")
        state = self._open.get(session_id)
        if state is None:
            raise GatewayError(404, f"unknown or ended session {session_id!r}")
        if state.over:
            raise GatewayError(409, f"session {session_id} has ended ({state.ended or 'reward posted'})")
        return state

    def _enqueue(self, session_id: str | None, body: dict) -> _Call:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise GatewayError(400, "messages must be a non-empty list of message objects")
        if body.get("n", 1) != 1:
            raise GatewayError(400, "n must be 1")
        call = _Call(body)
        with self._cond:
            state = self._session(session_id)
            if state.queued:
                raise GatewayError(409, f"session {session_id} already has a call in flight")
            state.queued.append(call)
            self._cond.notify_all()
        return call

    def _post_reward(self, session_id: str, body: dict) -> tuple[int, dict[str, Any]]:
        success, score = body.get("success"), body.get("score")
        if not isinstance(success, bool):
            return _error(400, "success must be true or false")
        if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))
                                  or not 0.0 <= score <= 1.0):
            return _error(400, f"score must be a number in [0, 1] or absent, got {score!r}")
        with self._cond:
            try:
                state = self._session(session_id)
            except GatewayError as e:
                return _error(e.status, str(e))
            state.outcome = (success, None if score is None else float(score))
            self._cond.notify_all()
        return 200, {"session_id": session_id, "status": "ended"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out as two writes: with Nagle's algorithm on, the second waits for the
    # client's delayed ACK of the first (~40 ms a call, measured: 48 ms against 4 ms without).
    disable_nagle_algorithm = True

    def log_message(self, *args) -> None:  # one line per request would drown the worker's log
        pass

    def _send(self, status: int, answer: dict[str, Any]) -> None:
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"null")
        except json.JSONDecodeError as e:
            self._send(*_error(400, f"the body is not JSON: {e}"))
            return
        status, answer = self.server.gateway.handle(self.path, self.headers, body)
        if status == 200 and answer.get("object") == "chat.completion" and body.get("stream"):
            self._send_events(_chunks(answer, body))
        else:
            self._send(status, answer)

    def _send_events(self, events: list[dict[str, Any]]) -> None:
        """A streamed answer as server-sent events (`data: <chunk>` each, then `data: [DONE]`),
        sent whole: the engine's tokens are not streamed, a streaming client reads the same
        message in chunks."""
        data = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/v1/models"):
            self._send(200, {"object": "list", "data": [{"id": "apprentice", "object": "model", "owned_by": "apprentice"}]})
        else:
            self._send(*_error(404, f"no route {self.path}"))


def _error(status: int, message: str) -> tuple[int, dict[str, Any]]:
    kind = {401: "authentication_error", 404: "not_found_error"}.get(status, "invalid_request_error")
    return status, {"error": {"message": message, "type": kind, "code": status}}


def _completion(body: dict, reply: dict, finish: str, num_prompt: int, num_response: int) -> dict[str, Any]:
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model") or "apprentice",
            "choices": [{"index": 0, "message": reply, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": num_prompt, "completion_tokens": num_response,
                      "total_tokens": num_prompt + num_response}}


def _chunks(completion: dict[str, Any], body: dict) -> list[dict[str, Any]]:
    """A chat.completion as the chat.completion.chunk events of OpenAI's stream layout: the
    message (role, text, reasoning, format error), its tool calls, the finish reason, then the
    usage when `stream_options.include_usage` asks for it."""
    choice = completion["choices"][0]
    message = dict(choice["message"])
    calls = message.pop("tool_calls", None)
    head = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
            "model": completion["model"]}

    def chunk(delta: dict, finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    events = [chunk(message)]
    if calls:
        events.append(chunk({"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]}))
    events.append(chunk({}, choice["finish_reason"]))
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append({**head, "choices": [], "usage": completion["usage"]})
    return events


def _text(content: Any) -> str:
    """A message's content as text (OpenAI allows a list of text parts)."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def _arguments(arguments: Any) -> Any:
    """Tool-call arguments as the chat template wants them: a JSON string decoded when it is one."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def _calls(message: dict) -> list[tuple[str, str]]:
    return [(c.get("function", {}).get("name"), json.dumps(_arguments(c.get("function", {}).get("arguments")),
                                                           sort_keys=True))
            for c in message.get("tool_calls") or []]


def _norm(message: dict) -> tuple:
    """What of a message the prefix rule compares: role, text, tool calls (ids and reasoning aside)."""
    return message.get("role"), _text(message.get("content")), tuple(_calls(message))


def _echoes(reply: dict, sent: dict) -> bool:
    """Whether `sent` is the assistant message `reply` as a program sends it back: the same text
    and tool calls; a malformed reply's recovered call may be left out (the built-in loop shows a
    malformed turn as its text only); reasoning may be dropped."""
    if sent.get("role") != "assistant" or _text(sent.get("content")) != reply["content"]:
        return False
    calls = _calls(sent)
    return calls == _calls(reply) or (not calls and "format_error" in reply)


def _template_message(message: dict) -> dict:
    """A message for the chat template: text content, tool-call arguments as objects."""
    out = {**message, "content": _text(message.get("content"))}
    if message.get("tool_calls"):
        out["tool_calls"] = [{**c, "function": {**c.get("function", {}),
                                                "arguments": _arguments(c.get("function", {}).get("arguments"))}}
                             for c in message["tool_calls"]]
    return out


def end_session(gateway_url: str, api_key: str, session_id: str, success: bool, score: float | None = None,
                timeout_s: float = 30.0) -> None:
    """The client helper: post a session's reward (`Session.gateway_url`, `.api_key`, `.session_id`)."""
    import urllib.request

    request = urllib.request.Request(f"{gateway_url}/v1/sessions/{session_id}/reward", method="POST",
                                     data=json.dumps({"success": success, "score": score}).encode(),
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {api_key}"} if api_key else {})})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        response.read()
