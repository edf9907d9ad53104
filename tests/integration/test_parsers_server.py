"""The server with `--reasoning-parser qwen3 --tool-call-parser qwen25`, through the `openai`
client: reasoning split from the answer, the model's own tool calls as `tool_calls`.

The embedded tiny model (random weights) would never write `<think>` or `<tool_call>` itself,
so each request holds it to such an output with structured outputs (a regex or a choice): the
parsers then see exactly what a thinking, tool-calling model writes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import openai
import pytest
from serving_helpers import (
    MODEL,
    Server,
    accumulate_tool_calls,
    no_whitespace_bias,
    scheduler_built,
    start_server,
)

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not scheduler_built(), reason="the C++ scheduler is not built"),
]

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
THINK = {"regex": r"<think>[a-z]{3,8}</think>[a-z]{2,6}"}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
CALLS = {"choice": [f"Let me check.{CALL}", f"<think>tool time</think>{CALL}{CALL}"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(
        tmp_path_factory.mktemp("serve-parsers"),
        "--max-total-tokens", "4096", "--max-model-len", "1024",
        "--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25",
    )  # fmt: skip
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def chat(client: openai.OpenAI, constraint: dict, **kw):
    kw = {"max_tokens": 300, "temperature": 1.0, "seed": 3, **kw}
    return client.chat.completions.create(
        model=MODEL, messages=USER, extra_body={"structured_outputs": constraint}, **kw
    )


def test_reasoning_is_split_from_the_answer(client: openai.OpenAI) -> None:
    r = chat(client, THINK, n=3)
    for c in r.choices:
        message = c.message.model_dump()
        assert re.fullmatch("[a-z]{3,8}", message["reasoning_content"]), message
        assert re.fullmatch("[a-z]{2,6}", message["content"]) and c.finish_reason == "stop"
    plain = chat(client, {"regex": "[a-z]{4}"}).choices[0].message.model_dump()
    assert plain["reasoning_content"] is None and re.fullmatch("[a-z]{4}", plain["content"])


def test_streamed_reasoning_then_content(client: openai.OpenAI) -> None:
    chunks = list(chat(client, THINK, stream=True))
    deltas = [c.choices[0].delta.model_dump() for c in chunks if c.choices]
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    whole = chat(client, THINK).choices[0].message.model_dump()
    assert (reasoning, content) == (whole["reasoning_content"], whole["content"])
    first_content = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert all(not d.get("reasoning_content") for d in deltas[first_content:])
    assert "<think>" not in content + reasoning and "</think>" not in content + reasoning


@pytest.mark.parametrize("tool_choice", [None, "auto"], ids=["default", "auto"])
def test_the_models_tool_calls_become_tool_calls(client: openai.OpenAI, tool_choice) -> None:
    extra = {} if tool_choice is None else {"tool_choice": tool_choice}
    r = chat(client, CALLS, tools=TOOLS, n=4, **extra)
    seen = set()
    for c in r.choices:
        assert c.finish_reason == "tool_calls"
        calls = c.message.tool_calls
        assert calls and all(tc.function.name == "get_weather" for tc in calls)
        assert all(json.loads(tc.function.arguments) == {"city": "Paris"} for tc in calls)
        message = c.message.model_dump()
        seen.add((message["content"], message["reasoning_content"], len(calls)))
    assert seen <= {("Let me check.", None, 1), (None, "tool time", 2)}


def test_streamed_tool_calls(client: openai.OpenAI) -> None:
    chunks = list(chat(client, CALLS, tools=TOOLS, stream=True, seed=5))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = accumulate_tool_calls(deltas)
    assert calls and all(c["id"].startswith("call_") and c["name"] == "get_weather" for c in calls)
    assert all(json.loads(c["arguments"]) == {"city": "Paris"} for c in calls)
    pieces = [tc for d in deltas for tc in d.tool_calls or [] if tc.function.arguments]
    assert len(pieces) > len(calls)  # the arguments streamed as the model wrote them
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "<tool_call>" not in text


def test_no_parsing_without_tools_or_with_tool_choice_none(client: openai.OpenAI) -> None:
    for kw in ({}, {"tools": TOOLS, "tool_choice": "none"}):
        message = chat(client, {"choice": [f"Let me check.{CALL}"]}, **kw).choices[0].message
        assert message.content == f"Let me check.{CALL}" and not message.tool_calls


def test_completions_are_raw_text(server: Server) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 40,
            "structured_outputs": {"choice": ["<think>raw</think>text"]}}  # fmt: skip
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=30)
    assert r.json()["choices"][0]["text"] == "<think>raw</think>text"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_forced_calls_with_a_reasoning_parser(client: openai.OpenAI, stream: bool) -> None:
    """A forced call goes through the reasoning split first (a thinking model's block comes
    before the grammar holds): without a block, the call is the whole output."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
        "required": ["city"], "additionalProperties": False}}}]  # fmt: skip
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(
        model=MODEL, messages=USER, tools=tools, tool_choice=named, max_tokens=60,
        temperature=0.7, seed=2, logit_bias=no_whitespace_bias(), stream=stream,
    )  # fmt: skip
    if stream:
        chunks = list(r)
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        arguments = "".join(tc.function.arguments or "" for d in deltas
                            for tc in d.tool_calls or [])  # fmt: skip
        assert not any(d.model_dump().get("reasoning_content") for d in deltas)
        assert chunks[-1].choices[0].finish_reason == "stop"
    else:
        message = r.choices[0].message
        assert message.model_dump()["reasoning_content"] is None
        arguments = message.tool_calls[0].function.arguments
    assert json.loads(arguments)["city"] in ("Paris", "Rome")
