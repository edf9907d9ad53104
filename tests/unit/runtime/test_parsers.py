"""Reasoning and tool-call parsers: whole outputs, and the same outputs streamed in any pieces."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenspeed.runtime.parsers.chat import ChatOutputParser
from tokenspeed.runtime.parsers.reasoning import (
    DeepSeekR1ReasoningParser,
    DeepSeekV3ReasoningParser,
    KimiK2ReasoningParser,
    KimiReasoningParser,
    Qwen3ReasoningParser,
)
from tokenspeed.runtime.parsers.streaming import TagScanner, held_tail
from tokenspeed.runtime.parsers.tool_calls import (
    DeepSeekV3ToolParser,
    DeepSeekV31ToolParser,
    HermesToolParser,
    KimiK2ToolParser,
)

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
    # arguments written as a JSON string: the call carries the string's text, streamed or not
    '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>',
    "",
    "<th",
]

# DeepSeek's and Kimi's tags (special tokens of their vocabularies)
DS_BEGIN, DS_END = (
    "<\uff5ctool\u2581calls\u2581begin\uff5c>",
    "<\uff5ctool\u2581calls\u2581end\uff5c>",
)
DS_CALL, DS_CALL_END = (
    "<\uff5ctool\u2581call\u2581begin\uff5c>",
    "<\uff5ctool\u2581call\u2581end\uff5c>",
)
DS_SEP = "<\uff5ctool\u2581sep\uff5c>"


def ds_v3_call(name: str, args: str) -> str:
    return f"{DS_CALL}function{DS_SEP}{name}\n```json\n{args}\n```{DS_CALL_END}"


def ds_v31_call(name: str, args: str) -> str:
    return f"{DS_CALL}{name}{DS_SEP}{args}{DS_CALL_END}"


def kimi_call(name: str, args: str, index: int = 0) -> str:
    return f"<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>{args}<|tool_call_end|>"


KIMI_BEGIN, KIMI_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
ARGS = '{"city": "Paris"}'
DS_V3_OUTPUTS = [
    f"Let me look.{DS_BEGIN}{ds_v3_call('get_weather', ARGS)}\n{ds_v3_call('get_time', '{}')}{DS_END}",
    f"{DS_BEGIN}{ds_v3_call('get_weather', 'not json')}{DS_END}",
    f"thought</think>{DS_BEGIN}{ds_v3_call('get_weather', ARGS)}{DS_END}",
    f"plain{DS_BEGIN}{DS_CALL}function{DS_SEP}cut",
    "no calls at all",
]
DS_V31_OUTPUTS = [
    f"ok{DS_BEGIN}{ds_v31_call('get_weather', ARGS)}{ds_v31_call('get_time', '{}')}{DS_END}",
    f"{DS_BEGIN}{ds_v31_call('get_weather', '{bad')}{DS_END} trailing",
    "plain answer",
]
KIMI_OUTPUTS = [
    f"<think>which tool?</think>Checking.{KIMI_BEGIN}{kimi_call('get_weather', ARGS)}"
    f"{kimi_call('get_time', '{}', 1)}{KIMI_END}",
    f"thinking straight into a call{KIMI_BEGIN}{kimi_call('get_weather', ARGS)}{KIMI_END}",
    f"done thinking</think>{KIMI_BEGIN}<|tool_call_begin|>get_weather<|tool_call_end|>{KIMI_END}",
    f"t</think>answer{KIMI_BEGIN}{kimi_call('get_weather', ARGS)}",  # section never closed
    "t</think>just an answer",
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
    # arguments written as a JSON string are that string's JSON, not its escaped literal
    quoted = '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
    assert HermesToolParser.parse(quoted)[1][0]["function"]["arguments"] == '{"x": 1}'


def test_reasoning_switches_and_implicit_ends():
    assert KimiK2ReasoningParser.split(f"hm{KIMI_BEGIN}x") == ("hm", f"{KIMI_BEGIN}x")
    assert KimiK2ReasoningParser.split("<think>hm</think>Yes") == ("hm", "Yes")
    assert KimiReasoningParser.split("\u25c1think\u25b7hm\u25c1/think\u25b7Yes") == ("hm", "Yes")
    assert KimiReasoningParser.split("<think>not its tag") == (None, "<think>not its tag")
    # who thinks: a request's chat-template arguments switch hybrid models
    assert Qwen3ReasoningParser.thinks(None) and not Qwen3ReasoningParser.thinks(
        {"enable_thinking": False}
    )
    assert not DeepSeekV3ReasoningParser.thinks({}) and DeepSeekV3ReasoningParser.thinks(
        {"thinking": True}
    )
    assert KimiK2ReasoningParser.thinks({"enable_thinking": False})  # not its switch
    assert not KimiK2ReasoningParser.thinks({"thinking": False})
    assert DeepSeekR1ReasoningParser.thinks({"thinking": False})  # always thinks


def args_of(calls: list[dict]) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_deepseek_tool_calls():
    content, calls = DeepSeekV3ToolParser.parse(DS_V3_OUTPUTS[0])
    assert content == "Let me look."
    assert args_of(calls) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    # a call whose header was written is a call, its arguments as written (as OpenAI's may be)
    content, calls = DeepSeekV3ToolParser.parse(DS_V3_OUTPUTS[1])
    assert content is None and calls[0]["function"] == {
        "name": "get_weather",
        "arguments": "not json",
    }
    content, calls = DeepSeekV31ToolParser.parse(DS_V31_OUTPUTS[0])
    assert content == "ok" and args_of(calls) == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {}),
    ]
    content, calls = DeepSeekV31ToolParser.parse(DS_V31_OUTPUTS[1])
    assert content == "trailing" and calls[0]["function"]["arguments"] == "{bad"
    cut = DS_V3_OUTPUTS[3]  # the name never ended: no call
    assert DeepSeekV3ToolParser.parse(cut) == (cut, [])
    # a V3.1 call is not a V3 call (no "function" kind, no fence)
    assert DeepSeekV3ToolParser.parse(DS_V31_OUTPUTS[0])[1] == []


WRITE = '{"path": "a.md", "body": "x = {1} ```py``` `"}'  # braces and fences inside


@pytest.mark.parametrize(
    ("tools", "text"),
    [
        (HermesToolParser, f'<tool_call>\n{{"name": "write", "arguments": {WRITE}}}\n</tool_call>'),
        (DeepSeekV3ToolParser, f"{DS_BEGIN}{ds_v3_call('write', WRITE)}{DS_END}"),
        (DeepSeekV31ToolParser, f"{DS_BEGIN}{ds_v31_call('write', WRITE)}{DS_END}"),
        (KimiK2ToolParser, f"{KIMI_BEGIN}{kimi_call('write', WRITE)}{KIMI_END}"),
    ],
)  # fmt: skip
def test_arguments_stream_before_the_call_ends(tools, text):
    """Character by character: the name goes out as soon as it is written, the arguments as
    they come (all but a possible closing), and together they are the whole parse's call."""
    parser, calls, sent = tools(), [], []
    for ch in text:
        content, deltas = parser.push(ch)
        accumulate(calls, {"tool_calls": deltas})
        sent.append(calls[0]["function"]["arguments"] if calls else None)
    tail, deltas = parser.flush()
    accumulate(calls, {"tool_calls": deltas})
    _, whole = tools.parse(text)
    assert [c["function"] for c in calls] == [c["function"] for c in whole]
    arguments = whole[0]["function"]["arguments"]
    json.loads(arguments)
    # before the end tag, all of the arguments but their last character had gone out
    end = text.index(tools.CALL_END)
    assert sent[end - 1] is not None and len(sent[end - 1]) >= len(arguments) - 1


def test_kimi_k2_tool_calls():
    content, calls = KimiK2ToolParser.parse(f"Checking.{KIMI_BEGIN}{kimi_call('get_weather', ARGS)}"
                                            f"\n{kimi_call('get_time', '{}', 1)}{KIMI_END}")  # fmt: skip
    assert content == "Checking."
    assert args_of(calls) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert [c["id"] for c in calls] == ["functions.get_weather:0", "functions.get_time:1"]
    # text after the section is content again; a section without calls is text
    content, calls = KimiK2ToolParser.parse(f"{KIMI_BEGIN}{kimi_call('f', '{}')}{KIMI_END} After.")
    assert content == "After." and args_of(calls) == [("f", {})]
    empty = f"x{KIMI_BEGIN}<|tool_call_begin|>f<|tool_call_end|>{KIMI_END}y"
    assert KimiK2ToolParser.parse(empty) == (empty, [])


def whole(text: str, reasoning, tools) -> tuple[dict, str]:
    parser = ChatOutputParser(reasoning() if reasoning else None, tools() if tools else None)
    return parser.message(text, "stop")


def accumulate(calls: list[dict], delta: dict) -> None:
    """A client's view: a call's first delta has its id and name, later ones add arguments."""
    for d in delta.get("tool_calls", []):
        if d["index"] == len(calls):
            assert d["id"] and d["type"] == "function" and d["function"]["name"]
            calls.append({"id": d["id"], "function": dict(d["function"])})
        else:
            assert d["index"] == len(calls) - 1 and set(d) == {"index", "function"}
            calls[-1]["function"]["arguments"] += d["function"]["arguments"]


def streamed(pieces: list[str], reasoning, tools) -> tuple[dict, str]:
    parser = ChatOutputParser(reasoning() if reasoning else None, tools() if tools else None)
    fields: dict = {}
    calls: list = []
    for delta in [parser.push(p) for p in pieces] + [parser.finish()]:
        for key in ("reasoning_content", "content"):
            if key in delta:
                fields[key] = fields.get(key, "") + delta[key]
        accumulate(calls, delta)
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
    (OUTPUTS, (Qwen3ReasoningParser, None)),
    (OUTPUTS, (DeepSeekR1ReasoningParser, None)),
    (OUTPUTS, (None, HermesToolParser)),
    (OUTPUTS, (Qwen3ReasoningParser, HermesToolParser)),
    (DS_V3_OUTPUTS, (DeepSeekR1ReasoningParser, DeepSeekV3ToolParser)),
    (DS_V3_OUTPUTS, (None, DeepSeekV3ToolParser)),
    (DS_V31_OUTPUTS, (None, DeepSeekV31ToolParser)),
    (KIMI_OUTPUTS, (KimiK2ReasoningParser, KimiK2ToolParser)),
    (KIMI_OUTPUTS, (None, KimiK2ToolParser)),
]


@settings(max_examples=150, deadline=None)
@given(
    case=st.sampled_from(PARSER_SETS).flatmap(
        lambda c: st.tuples(st.sampled_from(c[0]), st.just(c[1]))
    ),
    cuts=st.lists(st.integers(0, 200), max_size=10),
)
def test_streaming_in_any_pieces_equals_the_whole(case, cuts):
    text, parsers = case
    bounds = sorted({c for c in cuts if c <= len(text)} | {0, len(text)})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    message, reason = whole(text, *parsers)
    fields, streamed_reason = streamed(pieces, *parsers)
    same(fields, message)
    assert reason == streamed_reason
    assert (reason == "tool_calls") == bool(message.get("tool_calls"))
