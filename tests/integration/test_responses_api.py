"""`/v1/responses` (OpenAI's Responses API) through the official `openai` client.

Each answer is checked against what the chat route gives for the same conversation (same
seed, same tokens), so the request's translation (instructions, input items, earlier responses,
tools, formats) is pinned by token counts and texts, not just by shapes.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from serving_helpers import (
    MODEL,
    Server,
    no_whitespace_bias,
    scheduler_built,
)

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not scheduler_built(), reason="the C++ scheduler is not built"),
]

TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                         "required": ["city"], "additionalProperties": False}}]  # fmt: skip
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]


SERVER_FLAGS = (
    "--max-total-tokens", "8192", "--max-model-len", "2048",
)  # fmt: skip


def prompt_tokens(server: Server, messages: list[dict], tools: list | None = None) -> int:
    body = {"model": MODEL, "messages": messages, "tools": tools}
    return httpx.post(f"{server.url}/tokenize", json=body, timeout=30).json()["count"]


def test_an_answer_equals_the_chat_answer(client: openai.OpenAI, server: Server) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12,
                                          temperature=1.0, seed=7)  # fmt: skip
    r = client.responses.create(model=MODEL, instructions="Be brief.", input="Hello",
                                max_output_tokens=12, temperature=1.0, extra_body={"seed": 7})  # fmt: skip
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == chat.choices[0].message.content
    assert [item.type for item in r.output] == ["message"]
    assert r.usage.input_tokens == prompt_tokens(server, messages) == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    if chat.choices[0].finish_reason == "length":
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    else:
        assert r.status == "completed"
    assert r.instructions == "Be brief." and r.max_output_tokens == 12


def test_input_items_and_a_continued_conversation(client: openai.OpenAI, server: Server) -> None:
    first = client.responses.create(model=MODEL, input=[{"role": "user", "content": "Hi"}],
                                    max_output_tokens=6, extra_body={"seed": 1})  # fmt: skip
    answer = first.output_text
    second = client.responses.create(model=MODEL, input="And then?", max_output_tokens=6,
                                     previous_response_id=first.id)  # fmt: skip
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": answer},
               {"role": "user", "content": "And then?"}]  # fmt: skip
    assert second.usage.input_tokens == prompt_tokens(server, history)
    assert second.previous_response_id == first.id
    # the same conversation sent as items, with content parts
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": answer}]},
        {"role": "user", "content": "And then?"},
    ]  # fmt: skip
    third = client.responses.create(model=MODEL, input=items, max_output_tokens=6)
    assert third.usage.input_tokens == second.usage.input_tokens
    # its input items, listed back with ids (newest first by default), a page at a time
    listed = client.responses.input_items.list(third.id, order="asc")
    assert [(i.type, i.role, i.content[0].text) for i in listed.data] == [
        ("message", "user", "Hi"), ("message", "assistant", answer), ("message", "user", "And then?")
    ]  # fmt: skip
    newest = client.responses.input_items.list(third.id, limit=2)
    assert [i.content[0].text for i in newest.data] == ["And then?", answer] and newest.has_more
    rest = client.responses.input_items.list(third.id, limit=2, after=newest.data[-1].id)
    assert [i.content[0].text for i in rest.data] == ["Hi"] and not rest.has_more
    assert [i.content[0].text for i in client.responses.input_items.list(second.id).data] == [
        "And then?"
    ]  # a continued response lists its own input
    # stored: GET returns it, DELETE forgets it
    got = client.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == answer
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="x", previous_response_id=first.id)
    unstored = client.responses.create(model=MODEL, input="x", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_a_forced_function_call_and_its_output(client: openai.OpenAI, server: Server) -> None:
    kw = {"max_output_tokens": 60, "temperature": 0.7,
          "extra_body": {"seed": 2, "logit_bias": no_whitespace_bias()}}  # fmt: skip
    r = client.responses.create(model=MODEL, input="Weather?", tools=TOOLS,
                                tool_choice={"type": "function", "name": "get_weather"}, **kw)  # fmt: skip
    calls = [item for item in r.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and r.status == "completed"
    assert json.loads(calls[0].arguments)["city"] in ("Paris", "Rome")
    # the call's output goes back as an item; the prompt is the chat conversation with it
    follow = client.responses.create(
        model=MODEL, previous_response_id=r.id, tools=TOOLS, max_output_tokens=4,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}],
    )  # fmt: skip
    history = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": calls[0].call_id,
         "type": "function", "function": {"name": "get_weather",
                                          "arguments": calls[0].arguments}}]},
        {"role": "tool", "tool_call_id": calls[0].call_id, "content": "sunny"},
    ]  # fmt: skip
    assert follow.usage.input_tokens == prompt_tokens(server, history, CHAT_TOOLS)


def test_required_tool_calls(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model=MODEL, input="Weather?", tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_output_tokens=80, temperature=0.7,
        extra_body={"seed": 2, "logit_bias": no_whitespace_bias()},
    )  # fmt: skip
    assert r.status == "completed", r.output
    calls = [item for item in r.output if item.type == "function_call"]
    assert (
        len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    )
    assert json.loads(calls[0].arguments)["city"] in ("Paris", "Rome")


def test_text_format_json_schema(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}  # fmt: skip
    r = client.responses.create(
        model=MODEL, input="Yes or no?", max_output_tokens=40,
        text={"format": {"type": "json_schema", "name": "verdict", "schema": schema}},
        extra_body={"seed": 3, "logit_bias": no_whitespace_bias()},
    )  # fmt: skip
    assert json.loads(r.output_text)["answer"] in ("yes", "no")
    assert r.text.format.type == "json_schema"


def test_streamed_events(client: openai.OpenAI) -> None:
    whole = client.responses.create(model=MODEL, input="Stream me", max_output_tokens=10,
                                    extra_body={"seed": 4})  # fmt: skip
    events = list(client.responses.create(model=MODEL, input="Stream me", max_output_tokens=10,
                                          stream=True, extra_body={"seed": 4}))  # fmt: skip
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", f"response.{whole.status}"]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text == final.output_text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert client.responses.retrieve(final.id).output_text == text


def test_streamed_function_call(client: openai.OpenAI) -> None:
    events = list(client.responses.create(
        model=MODEL, input="Weather?", tools=TOOLS, max_output_tokens=60, stream=True,
        tool_choice={"type": "function", "name": "get_weather"},
        extra_body={"seed": 2, "logit_bias": no_whitespace_bias()},
    ))  # fmt: skip
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == deltas
    assert json.loads(deltas)["city"] in ("Paris", "Rome")
    assert events[-1].type == "response.completed"
    assert events[-1].response.output[0].arguments == deltas


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"input": "x", "tools": [{"type": "web_search"}]}, 400, "function tools"),
        ({"input": "x", "background": True}, 400, "background"),
        ({"input": [{"type": "image_generation_call"}]}, 400, "input[0]"),
        ({"input": []}, 400, "input"),
        ({"input": "x", "model": "other"}, 404, "does not exist"),
        ({"input": "x", "previous_response_id": "resp_nope"}, 404, "resp_nope"),
        ({"input": "x", "tools": [TOOLS[0]], "tool_choice": "auto"}, 400, "tool-call parser"),
        ({"input": [{"type": "function_call_output"}]}, 400, "call_id"),
        ({"input": "x", "tool_choice": "required"}, 400, "at least one tool"),
    ],
)
def test_bad_requests_are_openai_errors(server: Server, body: dict, status: int, words: str):
    r = httpx.post(f"{server.url}/v1/responses", json={"model": MODEL, **body}, timeout=30)
    assert r.status_code == status, r.text
    assert words in r.json()["error"]["message"]
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200


def test_bad_input_item_listings_are_openai_errors(client: openai.OpenAI, server: Server):
    r = client.responses.create(model=MODEL, input="x", max_output_tokens=2)
    url = f"{server.url}/v1/responses"
    for path, params, status, param in [
        ("resp_nope/input_items", {}, 404, "response_id"),
        (f"{r.id}/input_items", {"limit": 0}, 400, "limit"),
        (f"{r.id}/input_items", {"order": "up"}, 400, "order"),
        (f"{r.id}/input_items", {"after": "msg_nope"}, 400, "after"),
    ]:
        got = httpx.get(f"{url}/{path}", params=params, timeout=10)
        assert got.status_code == status and got.json()["error"]["param"] == param, got.text
