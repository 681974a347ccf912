"""Turn prompts: chat messages for the agent's k-th turn (docs/algorithms.md §1).

Messages: system (the environment's rules; the chat template adds the tool schemas), a user
message with the task and the observation at the start of the history window, then the last
W turns as assistant messages and the environment's answers. A well-formed turn is rendered
as a structured tool call followed by a `tool` message (Qwen3 renders it as
`<tool_response>` inside a user turn); a malformed turn keeps the model's raw text and is
answered by a user message that names the format error.

With W = "all" and no malformed turns, the prompt of turn k+1 extends the prompt of turn k;
with a finite window it does not once k > W (buffer/ detects that before packing).

Two-stage working memory (docs/algorithms.md §7): `working_memory`, the latest memory text, is
shown in the user message; `memory_request` ends the messages with the request for a new one
(the memory stage), otherwise they end where the action is asked for (the action stage).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from envs.parser import FormatError
from envs.protocol import ToolCall


class PromptConfig(BaseModel):
    """How much history a turn prompt shows, and how the tools are described."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    history_window: int | Literal["all"] = 10
    """Number of most recent turns shown (seeds: 10); 'all' shows the whole episode."""
    tools: Literal["schema", "compact"] = "schema"
    """'schema': the tool JSON schemas go to the chat template (Qwen3's rendering, for real
    models); 'compact': one line per tool (name: description) appended to the system message
    and no schemas (BabyAI-Text, tiny tokenizer: 325 instead of 619 first-prompt tokens) -- for
    tiny students, whose prompt length is their training cost."""
    system_message: bool = True
    """False: no system message (neither the environment's rules nor the tool list), for students
    trained from scratch, which learn the call format from demonstrations and to which the
    ~245 fixed tokens mean nothing yet cost most of every sample (BabyAI-Text 6x6, `tiny:mini`,
    one turn per sample: 3.6x the SFT steps per second; docs/babyai_text.md). Needs `tools:
    compact` (the chat template would write the schemas into a system message)."""

    last_action: bool = False
    """With `history_window: 0`, the user message names the call the last turn executed ("Your
    last action: turn_left"; "none" after a turn that did not act). A greedy policy that sees only
    the current view repeats itself for ever once a view comes back (turning left, then right, ...:
    27 of the 38 failed eval50 episodes of a BabyAI hour's policy; docs/babyai_text.md, "Greedy
    cycles"); the last call lets it tell those views apart, at ~8 prompt tokens."""

    revisits: bool = False
    """With `history_window: 0`, the user message says how many times the episode showed the current
    view before ("You have seen this view 2 times before"; nothing on a view's first showing). With
    the current view and the last call alone a greedy policy still walks the same circuit for ever
    once a view comes back (15-18 of a BabyAI hour's ~35 failed eval50 episodes, periods 3-16;
    docs/babyai_text.md, "Greedy cycles"): the count makes each lap's prompts new, so a policy can
    learn to leave the circuit. Measured in the hour (seed 0): cycles 11 of 42 failures against 23
    of 36, but eval50 0.16 against 0.28 without it -- an option, off."""

    revisit_action: bool = False
    """With `history_window: 0`, when the current view was shown earlier in the episode, the user
    message names the call taken at its last showing ("Your action here before: turn_right"; "none"
    when that turn did not act). `revisits` tells a circuit's lap only that it is one; this names
    what the last lap did here, so a policy can learn to do something else. Measured in the hour
    (seed 0): cycles 6 of 39 failures against 23 of 36, eval50 0.22 against 0.28 without it -- an
    option, off (docs/babyai_text.md, "Greedy cycles")."""

    @model_validator(mode="after")
    def _memory_cues_without_a_window(self) -> "PromptConfig":
        for name in ("last_action", "revisits", "revisit_action"):
            if getattr(self, name) and self.history_window != 0:
                raise ValueError(f"{name} is a cue for prompts that show no past turn; with history_window="
                                 f"{self.history_window} the shown turns hold it: set history_window: 0")
        return self

    @model_validator(mode="after")
    def _system_needs_compact_tools(self) -> "PromptConfig":
        if not self.system_message and self.tools != "compact":
            raise ValueError("system_message: false needs tools: compact (the chat template writes tool schemas "
                             "into a system message)")
        return self

    @field_validator("history_window")
    @classmethod
    def _non_negative(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 0:
            raise ValueError(f"history_window must be >= 0 or 'all', got {value}")
        return value


@dataclass(frozen=True)
class HistoryTurn:
    """One past turn as the prompt renders it."""

    response_text: str
    """The model's response, decoded (used verbatim when the turn was malformed)."""
    call: ToolCall | None
    """The executed call: parsed, a gentle-mode fallback, or None when nothing acted."""
    error: FormatError | None
    """The format error, or None when the response parsed."""
    think: str | None
    """Reasoning from the `<think>` block of a well-formed turn."""
    observation: str
    """The environment's observation after this turn."""


def _call_name(turn: HistoryTurn) -> str:
    return "none" if turn.call is None else turn.call.name


def _assistant_message(turn: HistoryTurn) -> dict[str, Any]:
    if turn.error is None and turn.call is not None:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function",
                            "function": {"name": turn.call.name, "arguments": turn.call.arguments}}],
        }
        if turn.think:
            message["reasoning_content"] = turn.think
        return message
    return {"role": "assistant", "content": turn.response_text}


def _answer_message(turn: HistoryTurn) -> dict[str, Any]:
    if turn.error is None:
        return {"role": "tool", "content": turn.observation}
    acted = f"It was read as {turn.call.name}." if turn.call is not None else "No action was taken."
    return {"role": "user",
            "content": f"Format error ({turn.error.reason.value}): answer with exactly one tool call. {acted}\n"
                       f"{turn.observation}"}


COMPACT_TOOLS_HEADER = 'Tools (call one as <tool_call>\n{"name": <tool>, "arguments": {}}\n</tool_call>):'


def compact_tools(tools: list[dict[str, Any]]) -> str:
    """One line per tool, `name: description`, under a header showing the call format."""
    lines = [COMPACT_TOOLS_HEADER]
    for tool in tools:
        function = tool["function"]
        lines.append(f"{function['name']}: {function.get('description', '')}".rstrip(": "))
    return "\n".join(lines)


def template_tools(config: PromptConfig, tools: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The `tools` argument for the chat template: the schemas, or None when they are compact."""
    return tools if config.tools == "schema" else None


def system_content(config: PromptConfig, system_prompt: str, tools: list[dict[str, Any]] | None) -> str:
    """The system message's text: the prompt, followed by the compact tool list when tools are compact."""
    if config.tools == "compact" and tools:
        return f"{system_prompt}\n\n{compact_tools(tools)}"
    return system_prompt


MEMORY_REQUEST = ("Before you act, write your working memory: what you understand of the environment and "
                  "the tools so far, where you are, and your plan. Plain notes, no tool call; your next "
                  "action will be chosen from these notes and the recent turns.")


def render_messages(config: PromptConfig, system_prompt: str, task: str, first_observation: str,
                    history: list[HistoryTurn], working_memory: str | None = None,
                    tools: list[dict[str, Any]] | None = None, system_extra: str = "",
                    memory_request: bool = False) -> list[dict[str, Any]]:
    """Chat messages for the next turn, given the task and every past turn of the episode.

    With `config.tools == "compact"`, `tools` are described in the system message itself;
    `system_extra` (privileged context, envs.privileged) ends the system message, which is left
    out when `config.system_message` is false and there is no extra.
    """
    window = len(history) if config.history_window == "all" else min(config.history_window, len(history))
    hidden = len(history) - window
    start_observation = first_observation if hidden == 0 else history[hidden - 1].observation
    user = f"Your task: {task}\n"
    # With a window of 0 no turn is ever shown and the count would only tell the turn number.
    if hidden and config.history_window != 0:
        user += f"({hidden} earlier turn{'s' if hidden > 1 else ''} not shown.)\n"
    if working_memory is not None:
        user += f"Your working memory:\n{working_memory}\n"
    if config.last_action and history:
        user += f"Your last action: {_call_name(history[-1])}\n"
    if config.revisits or config.revisit_action:
        # views[i] is the view turn i answered (history[i].call was taken there); views[-1] the current one.
        views = [first_observation] + [turn.observation for turn in history]
        earlier = [i for i, view in enumerate(views[:-1]) if view == views[-1]]
        if config.revisits and earlier:
            user += f"You have seen this view {len(earlier)} time{'s' if len(earlier) > 1 else ''} before\n"
        if config.revisit_action and earlier:
            user += f"Your action here before: {_call_name(history[earlier[-1]])}\n"
    user += f"\nWhat you see:\n{start_observation}"
    system = (system_content(config, system_prompt, tools) if config.system_message else "") + system_extra
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": user})
    for turn in history[hidden:]:
        messages.append(_assistant_message(turn))
        messages.append(_answer_message(turn))
    if memory_request:
        messages.append({"role": "user", "content": MEMORY_REQUEST})
    return messages
