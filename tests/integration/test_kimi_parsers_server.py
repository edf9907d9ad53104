"""The server with Kimi K2's parsers (`--reasoning-parser kimi_k2 --tool-call-parser kimi_k2`),
through the `openai` client.

Kimi K2 thinks from the first token (its template opens the block), may go straight from
thinking into a tool-call section, and writes calls between special tokens. The tiny model is
held to such outputs with structured outputs, as in test_parsers_server.py; its vocabulary
spells Kimi's tags as plain text, and its own special tokens show that the server keeps special
tokens in the text of requests whose tool-call parser needs them.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import openai
import pytest
from serving_helpers import MODEL, accumulate_tool_calls, scheduler_built

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not scheduler_built(), reason="the C++ scheduler is not built"),
]

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
SECTION = "<|tool_calls_section_begin|>{}<|tool_calls_section_end|>"
CALL = '<|tool_call_begin|>functions.get_weather:{}<|tool_call_argument_begin|>{{"city": "Paris"}}<|tool_call_end|>'  # noqa: E501
ONE_CALL = "checking" + SECTION.format(CALL.format(0))  # thinking runs into the section
TWO_CALLS = "which tool</think>On it." + SECTION.format(CALL.format(0) + CALL.format(1))
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]  # fmt: skip
IM_START = 1  # a special token of the tiny vocabulary ("<|im_start|>")


SERVER_FLAGS = (
    "--max-total-tokens", "4096", "--max-model-len", "1024",
    "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2",
)  # fmt: skip


def chat(client: openai.OpenAI, options: list[str], **kw):
    kw = {"max_tokens": 300, "temperature": 1.0, "seed": 3, **kw}
    extra = {"structured_outputs": {"choice": options}, **kw.pop("extra_body", {})}
    return client.chat.completions.create(model=MODEL, messages=USER, extra_body=extra, **kw)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_kimi_calls_after_thinking(client: openai.OpenAI, stream: bool) -> None:
    for text, reasoning, content, n_calls in [
        (ONE_CALL, "checking", None, 1),
        (TWO_CALLS, "which tool", "On it.", 2),
    ]:
        r = chat(client, [text], tools=TOOLS, stream=stream)
        if stream:
            chunks = list(r)
            deltas = [c.choices[0].delta for c in chunks if c.choices]
            got_reasoning = "".join(d.model_dump().get("reasoning_content") or "" for d in deltas)
            got_content = "".join(d.content or "" for d in deltas) or None
            calls = [SimpleNamespace(id=c["id"], function=SimpleNamespace(**c))
                     for c in accumulate_tool_calls(deltas)]  # fmt: skip
            finish = chunks[-1].choices[0].finish_reason
        else:
            message = r.choices[0].message
            got_reasoning = message.model_dump()["reasoning_content"]
            got_content, calls = message.content, message.tool_calls or []
            finish = r.choices[0].finish_reason
        assert (got_reasoning, got_content, finish) == (reasoning, content, "tool_calls")
        assert [tc.id for tc in calls] == [f"functions.get_weather:{i}" for i in range(n_calls)]
        assert all(json.loads(tc.function.arguments) == {"city": "Paris"} for tc in calls)


def test_thinking_off_is_all_answer(client: openai.OpenAI) -> None:
    """`chat_template_kwargs: {"thinking": false}`: nothing is taken for reasoning."""
    off = {"chat_template_kwargs": {"thinking": False}}
    message = chat(client, ["plain</think>answer"], extra_body=off).choices[0].message
    assert message.content == "plain</think>answer"
    assert message.model_dump().get("reasoning_content") is None
    on = chat(client, ["plain</think>answer"]).choices[0].message
    assert (on.model_dump()["reasoning_content"], on.content) == ("plain", "answer")


def test_special_tokens_are_kept_for_the_tool_parser_only(client: openai.OpenAI) -> None:
    """Kimi's tags are special tokens, so a request the tool parser reads keeps special tokens
    in its text; others drop them as usual. The stop token's own text is never output."""
    off = {"chat_template_kwargs": {"thinking": False}}
    kw = {"max_tokens": 4, "logit_bias": {str(IM_START): 100}, "extra_body": off}
    parsed = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, **kw)
    assert parsed.choices[0].message.content == "<|im_start|>" * 4
    plain = client.chat.completions.create(model=MODEL, messages=USER, **kw)
    assert plain.choices[0].message.content is None or plain.choices[0].message.content == ""
    # run to the stop token with special tokens kept: its text ("<|im_end|>") is not output
    kept = {"skip_special_tokens": False, **off}
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=400, n=6,
                                       temperature=1.0, seed=1, extra_body=kept)  # fmt: skip
    stopped = [c for c in r.choices if c.finish_reason == "stop"]
    assert stopped, "no sample reached the stop token"
    assert all("<|im_end|>" not in (c.message.content or "") for c in stopped)


def test_responses_api_items_from_the_parsers(client: openai.OpenAI) -> None:
    """/v1/responses over the same parsers: reasoning and function_call items."""
    kw = {"model": MODEL, "input": "Weather?", "max_output_tokens": 300, "tools": [
        {"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}
    ], "extra_body": {"seed": 3, "structured_outputs": {"choice": [TWO_CALLS]}}}  # fmt: skip
    r = client.responses.create(**kw)
    assert [i.type for i in r.output] == ["reasoning", "message", "function_call", "function_call"]
    assert r.output[0].content[0].text == "which tool" and r.output_text == "On it."
    assert [i.call_id for i in r.output[2:]] == [
        "functions.get_weather:0",
        "functions.get_weather:1",
    ]
    assert all(json.loads(i.arguments) == {"city": "Paris"} for i in r.output[2:])
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    events = list(client.responses.create(stream=True, **kw))
    final = events[-1].response
    assert events[-1].type == "response.completed"
    assert [i.type for i in final.output] == [i.type for i in r.output]
    assert [i.call_id for i in final.output[2:]] == [i.call_id for i in r.output[2:]]
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert reasoning == "which tool"
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == [i.type for i in r.output]
