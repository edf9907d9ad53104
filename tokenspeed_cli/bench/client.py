"""A streaming OpenAI-compatible client that times every chunk.

TTFT is the time from sending a request to the first chunk that carries generated text
(role-only and empty chunks do not count: some servers send them before any token); every
later text chunk adds one inter-token latency, the gap since the previous text chunk. Token
counts come from the final ``usage`` chunk (``stream_options.include_usage``), including
``prompt_tokens_details.cached_tokens``; without it, the output is counted with the benchmark
tokenizer.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
from tokenizers import Tokenizer

from tokenspeed_cli.bench.datasets import BenchRequest
from tokenspeed_cli.bench.errors import BenchError
from tokenspeed_cli.bench.tokens import count_tokens

Endpoint = Literal["chat", "completions"]
PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass
class RequestResult:
    """What one request measured (times in seconds, as vLLM saves them)."""

    success: bool = False
    prompt_len: int = 0
    output_len: int = 0
    cached_tokens: int | None = None
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    generated_text: str = ""
    error: str = ""


def normalise_base_url(url: str) -> str:
    """``http://host:port`` with no trailing slash or ``/v1`` (both spellings are common)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BenchError(f"--base-url must look like http://HOST:PORT, got {url!r}")
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def make_client(
    timeout_s: float | None = None, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """One pooled client for the whole run, with no connection cap below the benchmark's.

    ``transport`` replaces the network (tests pass an ``httpx.MockTransport``).
    """
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_s, connect=10.0),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        transport=transport,
    )


async def served_model(client: httpx.AsyncClient, base_url: str, model: str | None) -> str:
    """Check the server answers and name the model (the first of /v1/models if not given)."""
    try:
        resp = await client.get(f"{base_url}/v1/models", timeout=10.0)
    except httpx.HTTPError as e:
        raise BenchError(f"cannot reach the server at {base_url}: {describe(e)}") from None
    if resp.status_code != 200:
        if model is not None and resp.status_code in (404, 405):
            return model  # a gateway without /v1/models; the requests will tell
        raise BenchError(
            f"{base_url} is not an OpenAI-compatible server: GET /v1/models answered "
            f"HTTP {resp.status_code}"
        )
    if model is not None:
        return model
    try:
        return str(resp.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise BenchError(f"{base_url}/v1/models lists no model; pass --model") from None


def describe(e: BaseException) -> str:
    """A one-line reason for a transport error (httpx's own messages can be empty)."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def build_payload(
    endpoint: Endpoint, model: str, req: BenchRequest, ignore_eos: bool, extra: dict[str, Any]
) -> dict[str, Any]:
    """The request body: streamed, greedy, with usage, ``max_tokens`` set to the budget."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": req.output_len,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if endpoint == "chat":
        body["messages"] = req.messages
    else:
        body["prompt"] = req.prompt
    if ignore_eos:
        body["ignore_eos"] = True
    body.update(extra)
    return body


def _chunk_text(endpoint: Endpoint, choice: dict[str, Any]) -> str:
    if endpoint == "chat":
        delta = choice.get("delta") or {}
        return (delta.get("content") or "") + (delta.get("reasoning_content") or "")
    return choice.get("text") or ""


def _error_text(status: int, body: bytes) -> str:
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body.decode(errors="replace").strip()[:200]
    return f"HTTP {status}: {message}" if message else f"HTTP {status}"


async def send_request(
    client: httpx.AsyncClient,
    base_url: str,
    endpoint: Endpoint,
    model: str,
    req: BenchRequest,
    tokenizer: Tokenizer,
    ignore_eos: bool = True,
    extra_body: dict[str, Any] | None = None,
) -> RequestResult:
    """Send one streamed request and time it; failures come back as a result, never raised."""
    out = RequestResult(prompt_len=req.prompt_len)
    body = build_payload(endpoint, model, req, ignore_eos, extra_body or {})
    usage: dict[str, Any] | None = None
    events = 0
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", base_url + PATHS[endpoint], json=body) as resp:
            if resp.status_code != 200:
                out.error = _error_text(resp.status_code, await resp.aread())
                return out
            async for line in resp.aiter_lines():
                line = line.strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                events += 1
                if "error" in chunk:
                    err = chunk["error"]
                    out.error = str(err.get("message", err) if isinstance(err, dict) else err)
                    return out
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    text = _chunk_text(endpoint, choice)
                    if not text:
                        continue
                    now = time.perf_counter()
                    if not out.generated_text:
                        out.ttft = now - start
                    else:
                        out.itl.append(now - last)
                    last = now
                    out.generated_text += text
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        out.error = describe(e)
        return out
    out.latency = time.perf_counter() - start
    if events == 0:
        out.error = "the server sent no server-sent events (does it support streaming?)"
        return out
    if not out.generated_text:
        out.ttft = out.latency  # no visible text at all: the first token came with the end
    _apply_usage(out, usage, tokenizer)
    out.success = True
    return out


def _apply_usage(out: RequestResult, usage: dict[str, Any] | None, tokenizer: Tokenizer) -> None:
    """Prefer the server's counts; fall back to counting the text with our tokenizer."""
    usage = usage or {}
    completion = usage.get("completion_tokens")
    out.output_len = (
        int(completion) if completion is not None else count_tokens(tokenizer, out.generated_text)
    )
    if usage.get("prompt_tokens") is not None:
        out.prompt_len = int(usage["prompt_tokens"])
    details = usage.get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        out.cached_tokens = int(details["cached_tokens"])
