"""Parse one assistant response into a tool call.

Accepted shape (Qwen3's, docs/token_format.md): optional `<think>...</think>`, then exactly one
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, whitespace allowed around and
inside the blocks, nothing else. A trailing end-of-turn token is ignored.

Two modes (docs/algorithms.md §2):
- strict: anything else is a format error and the turn does not act;
- gentle: the turn is still a format error, but acts when a tool name can be recovered
  from the tail of the response (the last `fallback_tail_words` words; the last mention
  wins), so the episode goes on.

The parser never raises on model output: every rejection is a `FormatError` naming its
reason, and an accepted call always names a known tool with schema-valid arguments.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from envs.protocol import ToolCall
from envs.tools import argument_error, tools_by_name

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
END_OF_TURN_MARKERS = ("<|im_end|>", "<|endoftext|>")

ParseMode = Literal["strict", "gentle"]


class FormatReason(enum.Enum):
    """Why a response is not an acceptable tool call."""

    UNCLOSED_THINK = "unclosed_think"
    NO_TOOL_CALL = "no_tool_call"
    TEXT_BEFORE_CALL = "text_before_call"
    UNCLOSED_TOOL_CALL = "unclosed_tool_call"
    BAD_JSON = "bad_json"
    UNKNOWN_TOOL = "unknown_tool"
    UNEXPECTED_ARGUMENTS = "unexpected_arguments"
    TRAILING_TEXT = "trailing_text"
    SEVERAL_CALLS = "several_calls"


@dataclass(frozen=True)
class FormatError:
    """A rejected response: the reason and a short human-readable detail."""

    reason: FormatReason
    """Machine-readable reason (metrics are labelled with its value)."""
    detail: str
    """What exactly was wrong, for logs."""


@dataclass(frozen=True)
class ParseResult:
    """Outcome of parsing one response."""

    call: ToolCall | None
    """The call to execute: the parsed one, a gentle-mode fallback, or None (no action)."""
    error: FormatError | None
    """None when the response is well formed."""
    think: str | None
    """Content of the `<think>` block, if any."""

    @property
    def well_formed(self) -> bool:
        """True when the response parsed without any format error."""
        return self.error is None


class ToolCallParser:
    """Parser bound to one environment's tools and a mode."""

    def __init__(self, tools: list[dict[str, Any]], mode: ParseMode = "strict",
                 fallback_tail_words: int = 30) -> None:
        if mode not in ("strict", "gentle"):
            raise ValueError(f"parser mode must be 'strict' or 'gentle', got {mode!r}")
        if fallback_tail_words < 1:
            raise ValueError(f"fallback_tail_words must be >= 1, got {fallback_tail_words}")
        self._schemas = tools_by_name(tools)
        self.mode: ParseMode = mode
        self._tail_words = fallback_tail_words
        # Only argument-free tools can be recovered from a bare mention of their name.
        fallback_names = [n for n, p in self._schemas.items() if not p.get("required")]
        alternatives = "|".join(re.escape(n).replace("_", "[ _]") for n in
                                sorted(fallback_names, key=len, reverse=True))
        self._fallback_re = re.compile(rf"\b({alternatives})\b", re.IGNORECASE) if alternatives else None
        self._fallback_lookup = {n.lower(): n for n in fallback_names}

    def parse(self, text: str) -> ParseResult:
        """Parse one response (decoded text of the response tokens)."""
        think, call, error = self._parse_strict(text)
        if error is not None and self.mode == "gentle":
            call = self._fallback(text)
        return ParseResult(call=call, error=error, think=think)

    def _parse_strict(self, text: str) -> tuple[str | None, ToolCall | None, FormatError | None]:
        body = text
        for marker in END_OF_TURN_MARKERS:
            if body.rstrip().endswith(marker):
                body = body.rstrip()[: -len(marker)]
                break
        body = body.strip()
        think = None
        if body.startswith(THINK_OPEN):
            end = body.find(THINK_CLOSE)
            if end < 0:
                return None, None, _err(FormatReason.UNCLOSED_THINK, "<think> is never closed")
            think = body[len(THINK_OPEN):end].strip()
            body = body[end + len(THINK_CLOSE):].strip()
        num_calls = body.count(CALL_OPEN)
        if num_calls == 0:
            return think, None, _err(FormatReason.NO_TOOL_CALL, "no <tool_call> block")
        if num_calls > 1:
            return think, None, _err(FormatReason.SEVERAL_CALLS, f"{num_calls} <tool_call> blocks; exactly one is allowed")
        start = body.find(CALL_OPEN)
        if start > 0:
            return think, None, _err(FormatReason.TEXT_BEFORE_CALL, f"text before <tool_call>: {body[:start][:60]!r}")
        end = body.find(CALL_CLOSE)
        if end < 0:
            return think, None, _err(FormatReason.UNCLOSED_TOOL_CALL, "<tool_call> is never closed")
        trailing = body[end + len(CALL_CLOSE):]
        if trailing.strip():
            return think, None, _err(FormatReason.TRAILING_TEXT, f"text after </tool_call>: {trailing.strip()[:60]!r}")
        call, error = self._decode_call(body[len(CALL_OPEN):end])
        return think, call, error

    def _decode_call(self, raw: str) -> tuple[ToolCall | None, FormatError | None]:
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            return None, _err(FormatReason.BAD_JSON, f"invalid JSON: {str(exc)[:80]}")
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None, _err(FormatReason.BAD_JSON, 'the call must be a JSON object with a string "name"')
        extra = sorted(set(obj) - {"name", "arguments"})
        if extra:
            return None, _err(FormatReason.BAD_JSON, f"unexpected key(s) {extra} in the call object")
        name = obj["name"]
        if name not in self._schemas:
            return None, _err(FormatReason.UNKNOWN_TOOL, f"unknown tool {name[:40]!r}; known: {sorted(self._schemas)}")
        arguments = obj.get("arguments", {})
        problem = argument_error(self._schemas[name], arguments)
        if problem is not None:
            return None, _err(FormatReason.UNEXPECTED_ARGUMENTS, f"{name}: {problem}")
        return ToolCall(name=name, arguments=arguments), None

    def _fallback(self, text: str) -> ToolCall | None:
        if self._fallback_re is None:
            return None
        tail = " ".join(text.split()[-self._tail_words:])
        matches = self._fallback_re.findall(tail)
        if not matches:
            return None
        return ToolCall(name=self._fallback_lookup[re.sub(r"[ _]", "_", matches[-1].lower())], arguments={})


def format_tool_call(call: ToolCall) -> str:
    """The canonical response text for a call, as Qwen3 writes it; `parse` accepts it."""
    return f'{CALL_OPEN}\n{json.dumps({"name": call.name, "arguments": call.arguments})}\n{CALL_CLOSE}'


def _err(reason: FormatReason, detail: str) -> FormatError:
    return FormatError(reason=reason, detail=detail)


RECOVERY_TAIL_WORDS = 30
"""Words at the end of an unparsable response searched for an admissible command (the gentle
recipe's "last 30 tokens")."""


def recover_command(text: str, admissible: list[str]) -> str | None:
    """The admissible command that ends last in the tail of `text` (case and spacing ignored,
    whole words; of two ending at the same place, the longer: "go to shelf 10" over "shelf 1"'s
    prefix), or None when the tail names none."""
    tail = " ".join(re.sub(r"[^\w\s]", " ", text).lower().split()[-RECOVERY_TAIL_WORDS:])
    best: tuple[int, int, str] | None = None
    for command in admissible:
        wanted = " ".join(command.lower().split())
        for found in re.finditer(rf"(?<!\w){re.escape(wanted)}(?!\w)", tail):
            key = (found.end(), len(wanted), command)
            if best is None or key[:2] > best[:2]:
                best = key
    return None if best is None else best[2]
