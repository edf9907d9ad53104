"""Structured outputs through the real server: OpenAI's `response_format` and vLLM's
`structured_outputs`, with the official `openai` client.

The embedded tiny model has random weights, so any output that parses is the grammar's doing.
"""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest
from serving_helpers import MODEL, Server, no_whitespace_bias

pytestmark = pytest.mark.timeout(300)

USER = [{"role": "user", "content": "Give me an answer."}]
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["answer", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def check_schema(text: str) -> None:
    value = json.loads(text)
    assert set(value) == {"answer", "n"}
    assert value["answer"] in ("yes", "no") and 0 <= value["n"] <= 99


def test_response_format_json_schema(client: openai.OpenAI) -> None:
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True},
    }
    r = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=200, temperature=0.8, seed=1, n=3,
        response_format=fmt,  # type: ignore[arg-type]
    )  # fmt: skip
    for choice in r.choices:
        assert choice.finish_reason == "stop", choice.message.content
        check_schema(choice.message.content or "")


def test_structured_outputs_compact_json_streams(client: openai.OpenAI) -> None:
    body = {"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}}
    stream = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=60, stream=True, extra_body=body
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check_schema(text)
    assert re.fullmatch(r'\{"answer": "(yes|no)", "n": \d+\}', text)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_json_object_mode_starts_an_object(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=80, temperature=1.0, seed=4, n=4,
        response_format={"type": "json_object"},
    )  # fmt: skip
    for choice in r.choices:
        text = choice.message.content or ""
        assert text.lstrip().startswith("{")
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize(
    ("constraint", "matches"),
    [
        ({"regex": r"[0-9]{3}-[a-z]{2}"}, lambda t: re.fullmatch(r"[0-9]{3}-[a-z]{2}", t)),
        ({"choice": ["red", "green", "light blue"]}, lambda t: t in ("red", "green", "light blue")),
        ({"grammar": 'root ::= "<" [a-c]{2,3} ">"'}, lambda t: re.fullmatch(r"<[a-c]{2,3}>", t)),
    ],
    ids=["regex", "choice", "grammar"],
)
def test_completions_with_regex_choice_and_grammar(client: openai.OpenAI, constraint, matches):
    r = client.completions.create(
        model=MODEL, prompt=["Once upon a time", "x"], max_tokens=30, temperature=1.0, seed=2,
        extra_body={"structured_outputs": constraint},
    )  # fmt: skip
    assert len(r.choices) == 2
    for choice in r.choices:
        assert choice.finish_reason == "stop" and matches(choice.text), choice.text


def test_text_response_format_is_unconstrained(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=8, temperature=0)
    text = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=8, temperature=0, response_format={"type": "text"}
    )
    assert text.choices[0].message.content == plain.choices[0].message.content


BAD = [
    ("unknown schema type", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}}, "json_schema"),
    ("schema missing", {"response_format": {"type": "json_schema"}}, "json_schema"),
    ("unknown format", {"response_format": {"type": "yaml"}}, "response_format"),
    ("bad regex", {"structured_outputs": {"regex": "([a-"}}, "regex"),
    ("undefined rule", {"structured_outputs": {"grammar": "root ::= missing"}}, "grammar"),
    ("two constraints", {"structured_outputs": {"regex": "a", "choice": ["b"]}}, "exactly one"),
    ("no constraint", {"structured_outputs": {}}, "exactly one"),
    ("unknown constraint", {"structured_outputs": {"structural_tag": "x"}}, "structural_tag"),
    ("empty choice", {"structured_outputs": {"choice": []}}, "choice"),
    ("both fields", {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "not both"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "fields", "mention"), BAD, ids=[b[0] for b in BAD])
def test_bad_constraints_are_400_and_the_server_keeps_serving(
    server: Server, case: str, fields: dict, mention: str
) -> None:
    body = {"model": MODEL, "messages": USER, "max_tokens": 4, **fields}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and mention in err["message"], err
    ok = httpx.post(
        f"{server.url}/v1/completions",
        json={"model": MODEL, "prompt": "hi", "max_tokens": 2}, timeout=30,
    )  # fmt: skip
    assert ok.status_code == 200


# ---- forced tool calls ------------------------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Rome"]},
                       "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "noop", "parameters": {
        "type": "object", "properties": {}, "additionalProperties": False}}},
]  # fmt: skip
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def no_whitespace() -> dict[str, int]:
    return no_whitespace_bias()


def check_weather_call(call) -> None:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert args["city"] in ("Paris", "Rome") and 1 <= args["days"] <= 7


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_named_tool_choice_answers_with_that_call(client, no_whitespace, stream) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=USER, tools=TOOLS, tool_choice=NAMED, max_tokens=60,
        temperature=0.7, seed=5, logit_bias=no_whitespace, stream=stream,
    )  # fmt: skip
    if not stream:
        (choice,) = r.choices
        assert choice.finish_reason == "stop" and choice.message.content is None
        (call,) = choice.message.tool_calls
        check_weather_call(call)
        return
    chunks = list(r)
    head = chunks[0].choices[0].delta.tool_calls[0]  # id and name first, then the arguments
    assert head.function.name == "get_weather" and head.function.arguments == ""
    arguments = "".join(c.choices[0].delta.tool_calls[0].function.arguments
                        for c in chunks[1:] if c.choices and c.choices[0].delta.tool_calls)  # fmt: skip
    assert chunks[-1].choices[0].finish_reason == "stop"
    head.function.arguments = arguments
    check_weather_call(head)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_required_tool_choice_answers_with_calls(client, no_whitespace, stream) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=USER, tools=TOOLS, tool_choice="required", max_tokens=120,
        temperature=0.7, seed=6, logit_bias=no_whitespace, n=2, stream=stream,
    )  # fmt: skip
    if stream:
        calls: dict[int, list] = {0: [], 1: []}
        finish = {}
        for chunk in r:
            for c in chunk.choices:
                calls[c.index] += c.delta.tool_calls or []
                finish[c.index] = c.finish_reason or finish.get(c.index)
        assert finish == {0: "tool_calls", 1: "tool_calls"}
        per_choice = [[tc.function for tc in calls[i]] for i in (0, 1)]
    else:
        assert [c.finish_reason for c in r.choices] == ["tool_calls", "tool_calls"]
        per_choice = [[tc.function for tc in c.message.tool_calls] for c in r.choices]
    for functions in per_choice:
        assert functions and {f.name for f in functions} <= {"get_weather", "noop"}
        for f in functions:
            args = json.loads(f.arguments)
            assert args == {} if f.name == "noop" else args["city"] in ("Paris", "Rome")


def test_required_without_parallel_calls_makes_one(client, no_whitespace) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=USER, tools=TOOLS, tool_choice="required", max_tokens=120,
        temperature=0.7, seed=8, logit_bias=no_whitespace, n=3, parallel_tool_calls=False,
    )  # fmt: skip
    assert [len(c.message.tool_calls or []) for c in r.choices] == [1, 1, 1]


@pytest.mark.parametrize(
    ("choice", "fields", "mention"),
    [
        ("auto", {}, "tool-call parser"),
        ({"type": "function", "function": {"name": "nope"}}, {}, "not among the tools"),
        ("required", {"response_format": {"type": "json_object"}}, "cannot be combined"),
    ],
    ids=["auto", "unknown-name", "with-response-format"],
)
def test_tool_choices_that_cannot_be_honoured_are_400(server, choice, fields, mention) -> None:
    body = {"model": MODEL, "messages": USER, "tools": TOOLS, "tool_choice": choice, **fields}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and mention in r.json()["error"]["message"], r.text
