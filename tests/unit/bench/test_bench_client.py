"""The streaming client against an in-memory server: what counts as a token arrival,
where token counts come from, how failures are reported."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from bench_fake_openai import FakeServer, sse
from tokenizers import Tokenizer

from tokenspeed_cli.bench.client import (
    RequestResult,
    build_payload,
    make_client,
    normalise_base_url,
    send_request,
    served_model,
)
from tokenspeed_cli.bench.datasets import BenchRequest
from tokenspeed_cli.bench.errors import BenchError

REQ = BenchRequest(" hello world", [{"role": "user", "content": " hello world"}], 2, 5)


def _send(transport: httpx.AsyncBaseTransport, endpoint: str, tok: Tokenizer,
          **kw: Any) -> RequestResult:  # fmt: skip
    async def go() -> RequestResult:
        async with make_client(transport=transport) as client:
            return await send_request(client, "http://x", endpoint, "m", REQ, tok, **kw)  # type: ignore[arg-type]

    return asyncio.run(go())


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_stream_timing_and_usage(endpoint: str, tokenizer: Tokenizer) -> None:
    r = _send(FakeServer().transport(), endpoint, tokenizer)
    assert r.success and r.error == ""
    assert r.generated_text == " ans1 done"
    assert len(r.itl) == 2  # three text chunks; the role-only chunk is not a token
    assert 0 < r.ttft <= r.latency
    assert r.output_len == 5 and r.prompt_len == 101 and r.cached_tokens == 7


def test_without_usage_counts_output_with_tokenizer(tokenizer: Tokenizer) -> None:
    r = _send(FakeServer(usage=False).transport(), "chat", tokenizer)
    assert r.success
    assert r.output_len == len(tokenizer.encode(" ans1 done", add_special_tokens=False).ids)
    assert r.prompt_len == 2 and r.cached_tokens is None  # the dataset's count stays


def test_http_error_is_reported_not_raised(tokenizer: Tokenizer) -> None:
    r = _send(FakeServer(fail_when=lambda b: 400).transport(), "chat", tokenizer)
    assert not r.success and r.error == "HTTP 400: injected failure"


def test_error_event_in_stream(tokenizer: Tokenizer) -> None:
    body = sse({"error": {"message": "engine died"}})
    t = httpx.MockTransport(lambda req: httpx.Response(200, content=body))
    r = _send(t, "completions", tokenizer)
    assert not r.success and r.error == "engine died"


def test_non_streaming_answer_is_an_error(tokenizer: Tokenizer) -> None:
    t = httpx.MockTransport(lambda req: httpx.Response(200, json={"choices": []}))
    r = _send(t, "completions", tokenizer)
    assert not r.success and "no server-sent events" in r.error


def test_transport_error_is_reported(tokenizer: Tokenizer) -> None:
    def refuse(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    r = _send(httpx.MockTransport(refuse), "chat", tokenizer)
    assert not r.success and r.error == "ConnectError: connection refused"


def test_payload_shapes() -> None:
    chat = build_payload("chat", "m", REQ, True, {"top_k": 1})
    assert chat["messages"] == REQ.messages and "prompt" not in chat
    assert chat["max_tokens"] == 5 and chat["ignore_eos"] is True and chat["top_k"] == 1
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    comp = build_payload("completions", "m", REQ, False, {})
    assert comp["prompt"] == REQ.prompt and "messages" not in comp and "ignore_eos" not in comp


def test_normalise_base_url() -> None:
    assert normalise_base_url("http://h:1/") == "http://h:1"
    assert normalise_base_url("http://h:1/v1/") == "http://h:1"
    assert normalise_base_url("https://h/proxy") == "https://h/proxy"
    for bad in ["h:1", "ftp://h", "http://"]:
        with pytest.raises(BenchError, match="--base-url"):
            normalise_base_url(bad)


def _model(handler: Any, model: str | None) -> str:
    async def go() -> str:
        async with make_client(transport=httpx.MockTransport(handler)) as client:
            return await served_model(client, "http://x", model)

    return asyncio.run(go())


def test_served_model() -> None:
    assert _model(FakeServer().handle, None) == "fake-model"
    assert _model(FakeServer().handle, "mine") == "mine"
    assert _model(lambda r: httpx.Response(404), "mine") == "mine"
    with pytest.raises(BenchError, match="answered HTTP 404"):
        _model(lambda r: httpx.Response(404), None)
    with pytest.raises(BenchError, match="lists no model"):
        _model(lambda r: httpx.Response(200, json={"data": []}), None)

    def refuse(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    with pytest.raises(BenchError, match="cannot reach the server at http://x"):
        _model(refuse, None)
