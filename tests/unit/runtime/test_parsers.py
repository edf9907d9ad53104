"""Reasoning and tool-call parsers: whole outputs, and the same outputs streamed in any pieces."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenspeed.runtime.parsers.chat import ChatOutputParser
from tokenspeed.runtime.parsers.reasoning import DeepSeekR1ReasoningParser, Qwen3ReasoningParser
from tokenspeed.runtime.parsers.streaming import TagScanner, held_tail
from tokenspeed.runtime.parsers.tool_calls import HermesToolParser

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
OUTPUTS = [
    "plain answer",
    "<think>let me see</think>\n\nThe answer is 4.",
    "  <think>a < b, and </thin is not the end</think>done",
    "<think>unfinished thought",
    "thinking without the tag</think>answer",
    f"I'll check.\n{CALL}",
    f"<think>call a tool</think>{CALL}\n{CALL.replace('Paris', 'Rome')}",
    "<tool_call>not json</tool_call> after",
    '<tool_call>{"name": "cut',
    "",
    "<th",
]


def test_held_tail_and_scanner():
    assert held_tail("abc</th", "</think>") == 4 and held_tail("abc", "</think>") == 0
    scan = TagScanner("</think>")
    assert scan.push("one </th") == ("one ", False)
    assert scan.push("ink> two") == ("", True) and scan.take_rest() == " two"


@pytest.mark.parametrize(
    ("parser", "text", "want"),
    [
        (Qwen3ReasoningParser, "<think>hm</think>\n\nYes.", ("hm", "\n\nYes.")),
        (Qwen3ReasoningParser, "No thinking here.", (None, "No thinking here.")),
        (Qwen3ReasoningParser, "<think>never ends", ("never ends", None)),
        (DeepSeekR1ReasoningParser, "hm</think>Yes.", ("hm", "Yes.")),
        (DeepSeekR1ReasoningParser, "<think>hm</think>Yes.", ("hm", "Yes.")),
        (DeepSeekR1ReasoningParser, "all thought", ("all thought", None)),
    ],
)
def test_reasoning_split(parser, text, want):
    assert parser.split(text) == want


def test_hermes_tool_calls():
    content, calls = HermesToolParser.parse(f"I'll check.\n{CALL}\n{CALL}")
    assert content == "I'll check."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_weather"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert calls[0]["id"] != calls[1]["id"] and calls[0]["type"] == "function"
    assert HermesToolParser.parse("no calls") == ("no calls", [])
    bad = "<tool_call>not json</tool_call>"
    assert HermesToolParser.parse(bad) == (bad, [])  # kept as text, not dropped
    assert HermesToolParser.parse('<tool_call>{"name": "x"')[1] == []  # cut short: text


def whole(text: str, reasoning, tools) -> tuple[dict, str]:
    parser = ChatOutputParser(reasoning() if reasoning else None, tools() if tools else None)
    return parser.message(text, "stop")


def streamed(pieces: list[str], reasoning, tools) -> tuple[dict, str]:
    parser = ChatOutputParser(reasoning() if reasoning else None, tools() if tools else None)
    fields: dict = {}
    calls: list = []
    for delta in [parser.push(p) for p in pieces] + [parser.finish()]:
        for key in ("reasoning_content", "content"):
            if key in delta:
                fields[key] = fields.get(key, "") + delta[key]
        calls += delta.get("tool_calls", [])
    assert [c["index"] for c in calls] == list(range(len(calls)))
    return {**fields, "tool_calls": calls}, parser.finish_reason("stop")


def same(a: dict, b: dict) -> None:
    """The streamed fields equal the whole message's (content up to the whitespace the whole
    message trims around calls; call ids differ by construction)."""
    for key in ("reasoning_content", "content"):
        sa, sb = a.get(key) or "", b.get(key) or ""
        assert (sa.strip() if b.get("tool_calls") else sa) == (
            sb.strip() if b.get("tool_calls") else sb
        ), key
    fa = [c["function"] for c in a.get("tool_calls") or []]
    fb = [c["function"] for c in b.get("tool_calls") or []]
    assert fa == fb


PARSER_SETS = [
    (Qwen3ReasoningParser, None),
    (DeepSeekR1ReasoningParser, None),
    (None, HermesToolParser),
    (Qwen3ReasoningParser, HermesToolParser),
]


@settings(max_examples=60, deadline=None)
@given(
    text=st.sampled_from(OUTPUTS),
    cuts=st.lists(st.integers(0, 120), max_size=8),
    parsers=st.sampled_from(PARSER_SETS),
)
def test_streaming_in_any_pieces_equals_the_whole(text, cuts, parsers):
    bounds = sorted({c for c in cuts if c <= len(text)} | {0, len(text)})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    message, reason = whole(text, *parsers)
    fields, streamed_reason = streamed(pieces, *parsers)
    same(fields, message)
    assert reason == streamed_reason
    assert (reason == "tool_calls") == bool(message.get("tool_calls"))
