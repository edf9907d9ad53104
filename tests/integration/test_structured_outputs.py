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
from serving_helpers import MODEL, Server

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
