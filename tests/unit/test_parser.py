import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.babyai_text.env import BABYAI_TOOLS
from envs.parser import FormatReason, ToolCallParser, format_tool_call
from envs.protocol import ToolCall
from envs.tools import argument_error, function_tool, tools_by_name

NAMES = [t["function"]["name"] for t in BABYAI_TOOLS]
ARG_TOOLS = BABYAI_TOOLS + [function_tool("go_to", "Go to a place.", {"target": {"type": "string"}}, ["target"])]
strict = ToolCallParser(ARG_TOOLS, "strict")
gentle = ToolCallParser(ARG_TOOLS, "gentle")

QWEN3_CALL = '<tool_call>\n{"name": "turn_left", "arguments": {}}\n</tool_call>'


@pytest.mark.parametrize("text", [
    QWEN3_CALL,
    '<tool_call>{"name":"go_forward","arguments":{}}</tool_call>',
    '  <tool_call>{"name": "toggle"}</tool_call>  \n',
    "<think>\nThe key is ahead.\n</think>\n\n" + QWEN3_CALL,
    QWEN3_CALL + "<|im_end|>",
    '<tool_call>\n{"name": "go_to", "arguments": {"target": "kitchen"}}\n</tool_call>',
])
def test_accepts_well_formed(text):
    result = strict.parse(text)
    assert result.well_formed and result.call is not None, result.error


def test_think_is_returned():
    result = strict.parse("<think>\nplan: turn\n</think>\n\n" + QWEN3_CALL)
    assert result.think == "plan: turn" and result.call == ToolCall("turn_left", {})


@pytest.mark.parametrize("text, reason", [
    ("<think>never closed " + QWEN3_CALL, FormatReason.UNCLOSED_THINK),
    ("I will turn left.", FormatReason.NO_TOOL_CALL),
    ("", FormatReason.NO_TOOL_CALL),
    ("Sure! " + QWEN3_CALL, FormatReason.TEXT_BEFORE_CALL),
    ('<tool_call>{"name": "turn_left", "arguments": {}}', FormatReason.UNCLOSED_TOOL_CALL),
    ("<tool_call>{name: turn_left}</tool_call>", FormatReason.BAD_JSON),
    ('<tool_call>["turn_left"]</tool_call>', FormatReason.BAD_JSON),
    ('<tool_call>{"name": 3}</tool_call>', FormatReason.BAD_JSON),
    ('<tool_call>{"name": "turn_left", "args": {}}</tool_call>', FormatReason.BAD_JSON),
    ('<tool_call>' + "[" * 100000 + '</tool_call>', FormatReason.BAD_JSON),
    ('<tool_call>{"name": "fly", "arguments": {}}</tool_call>', FormatReason.UNKNOWN_TOOL),
    ('<tool_call>{"name": "turn_left", "arguments": {"x": 1}}</tool_call>', FormatReason.UNEXPECTED_ARGUMENTS),
    ('<tool_call>{"name": "turn_left", "arguments": "{}"}</tool_call>', FormatReason.UNEXPECTED_ARGUMENTS),
    ('<tool_call>{"name": "go_to", "arguments": {}}</tool_call>', FormatReason.UNEXPECTED_ARGUMENTS),
    (QWEN3_CALL + " done", FormatReason.TRAILING_TEXT),
    (QWEN3_CALL + "</think>", FormatReason.TRAILING_TEXT),
    (QWEN3_CALL + QWEN3_CALL, FormatReason.SEVERAL_CALLS),
])
def test_rejections_name_their_reason(text, reason):
    result = strict.parse(text)
    assert result.call is None
    assert result.error is not None and result.error.reason == reason, result.error
    assert result.error.detail


def test_gentle_mode_falls_back_on_the_last_tool_named_in_the_tail():
    result = gentle.parse("I think I should turn left, no, go forward")
    assert not result.well_formed and result.error.reason == FormatReason.NO_TOOL_CALL
    assert result.call == ToolCall("go_forward", {})
    # Tools with required arguments are never guessed; nothing named -> no action.
    assert gentle.parse("go_to somewhere").call is None
    assert gentle.parse("hello").call is None
    # Only the tail counts.
    tail_only = ToolCallParser(BABYAI_TOOLS, "gentle", fallback_tail_words=3)
    assert tail_only.parse("toggle " + "word " * 10).call is None


def test_format_tool_call_round_trips():
    for name in NAMES:
        call = ToolCall(name, {})
        assert strict.parse(format_tool_call(call)).call == call


def test_bad_parser_settings():
    with pytest.raises(ValueError, match="mode"):
        ToolCallParser(BABYAI_TOOLS, "lenient")
    with pytest.raises(ValueError, match="fallback_tail_words"):
        ToolCallParser(BABYAI_TOOLS, "gentle", fallback_tail_words=0)


# --- property-based: the parser never raises and never accepts an invalid call -------------

SCHEMAS = tools_by_name(ARG_TOOLS)
FRAGMENTS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_end|>", "\n", " ", "{", "}",
             '"name"', '"arguments"', ":", ",", "[", "]", '"', "null", "{}", "go forward", "turn_left",
             '"turn_left"', '"go_to"', '"target"', '"x"', "1", "true"] + NAMES
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                           max_leaves=6)


def _independent_check(text: str, call: ToolCall) -> None:
    """What an accepted response must look like, checked without the parser's code."""
    body = text.strip()
    for marker in ("<|im_end|>", "<|endoftext|>"):
        if body.endswith(marker):
            body = body[: -len(marker)].strip()
    match = re.fullmatch(r"(<think>.*?</think>)?\s*<tool_call>(.*)</tool_call>", body, re.DOTALL)
    assert match, text
    # The think block is free text and may spell the markers; what follows it holds exactly one call.
    after_think = body[match.end(1):] if match.group(1) else body
    assert after_think.count("<tool_call>") == 1 and after_think.count("</tool_call>") == 1
    obj = json.loads(match.group(2))
    assert obj["name"] == call.name and call.name in SCHEMAS
    assert argument_error(SCHEMAS[call.name], call.arguments) is None


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=300))
def test_random_text_never_raises(text):
    for parser in (strict, gentle):
        result = parser.parse(text)
        if result.well_formed:
            _independent_check(text, result.call)
        if parser is strict:
            assert (result.call is None) == (result.error is not None)


@settings(max_examples=600, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=25).map("".join))
def test_adversarial_fragments_never_accept_invalid_calls(text):
    for parser in (strict, gentle):
        result = parser.parse(text)
        if result.well_formed:
            _independent_check(text, result.call)
        elif result.call is not None:
            assert parser is gentle and result.call.name in NAMES


@settings(max_examples=400, deadline=None)
@given(name=st.sampled_from(NAMES + ["go_to", "fly", ""]), arguments=json_values,
       think=st.none() | st.text(max_size=20), junk=st.text(max_size=8))
def test_structured_calls(name, arguments, think, junk):
    payload = json.dumps({"name": name, "arguments": arguments})
    text = (f"<think>{think}</think>" if think is not None else "") + f"<tool_call>{payload}</tool_call>" + junk
    result = strict.parse(text)
    valid = (name in SCHEMAS and argument_error(SCHEMAS[name], arguments) is None
             and "</think>" not in (think or "") and "<tool_call>" not in (think or "")
             and not junk.strip().removesuffix("<|im_end|>").strip())
    if result.well_formed:
        _independent_check(text, result.call)
        assert result.call.arguments == arguments
    if valid:
        assert result.well_formed, (text, result.error)
