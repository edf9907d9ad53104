"""What the OpenAI routes share: the server's state, the engine's sampling params, collecting
a generation (aborting it if the client leaves), and SSE framing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tokenspeed.runtime.config import ServerArgs
from tokenspeed.runtime.entrypoints.async_llm import AsyncLLM, RequestFailed, SequenceDelta
from tokenspeed.runtime.entrypoints.metrics import ServerMetrics
from tokenspeed.runtime.entrypoints.openai_protocol import OpenAIError, SamplingFields, error_body

logger = logging.getLogger("tokenspeed.server")


@dataclass
class ServerState:
    """Everything the handlers share; built once at startup."""

    args: ServerArgs
    llm: AsyncLLM
    tokenizer: Any
    metrics: ServerMetrics
    model_name: str
    engine_info: dict[str, Any]
    vocab_size: int
    started: float = field(default_factory=time.time)
    _token_text: dict[int, str] = field(default_factory=dict)

    def check_model(self, name: str | None) -> None:
        """A request naming another model is a 404 (no name: this one)."""
        if name is not None and name != self.model_name:
            raise OpenAIError(
                f"the model {name!r} does not exist; this server serves {self.model_name!r}",
                status=404,
                param="model",
                code="model_not_found",
            )

    def token_text(self, token_id: int) -> str:
        """A token's own text, for logprobs (cached: the vocabulary is finite)."""
        text = self._token_text.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_text[token_id] = text
        return text


def error_response(err: OpenAIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


def engine_params(req: SamplingFields, max_tokens: int, logprobs: int | None) -> dict[str, Any]:
    """The engine's sampling params (the runtime's `SamplingParams` fields) for one request.

    Stop strings stay in the server (they need the text); stop token ids and the output's
    grammar (structured outputs) go to the engine.
    """
    params: dict[str, Any] = {
        "max_tokens": max_tokens,
        "min_tokens": min(req.min_tokens, max_tokens),
        "stop_token_ids": list(req.stop_token_ids or []),
        "ignore_eos": req.ignore_eos,
        "logprobs": logprobs,
        "seed": req.seed,
        "skip_special_tokens": req.skip_special_tokens,
    }
    optional = {
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "repetition_penalty": req.repetition_penalty,
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    if req.logit_bias:  # as pairs: msgpack maps keep string keys only
        params["logit_bias"] = [[int(t), float(b)] for t, b in req.logit_bias.items()]
    grammar = req.grammar_spec()
    if grammar is not None:
        params["grammar"] = grammar.to_dict()
    return params


def merge_deltas(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two parser deltas as one: texts joined, tool calls in order."""
    out = dict(a)
    for key, value in b.items():
        out[key] = out[key] + value if key in out else value
    return out


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _until_disconnect(request: Request) -> None:
    """Return when the client closes the connection (the body is already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def collect_or_abort(request: Request, coro: Any) -> Any:
    """Run a non-streaming generation; cancel it (aborting in the engine) if the client leaves."""
    work = asyncio.ensure_future(coro)
    watch = asyncio.ensure_future(_until_disconnect(request))
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        if work in done:
            return work.result()
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        return None
    finally:
        watch.cancel()
        work.cancel()


class Choices:
    """Accumulates the deltas of a non-streaming response, per choice."""

    def __init__(self, count: int) -> None:
        self.text = [""] * count
        self.ids: list[list[int]] = [[] for _ in range(count)]
        self.lp: list[list[float]] = [[] for _ in range(count)]
        self.top: list[list[list[tuple[int, float]]]] = [[] for _ in range(count)]
        self.finish: list[str | None] = [None] * count
        self.tokens = [0] * count
        self.cached = [0] * count

    def add(self, d: SequenceDelta) -> None:
        i = d.index
        self.text[i] += d.text
        self.ids[i].extend(d.token_ids)
        if d.logprobs is not None:
            self.lp[i].extend(d.logprobs)
            self.top[i].extend(d.top_logprobs or [])
        self.finish[i] = d.finish_reason or self.finish[i]
        self.tokens[i] = d.completion_tokens
        self.cached[i] = d.cached_tokens


async def collect(stream: AsyncIterator[SequenceDelta], count: int) -> Choices:
    """Run a generation to the end and accumulate it per choice."""
    out = Choices(count)
    async with contextlib.aclosing(stream) as s:  # type: ignore[type-var]
        async for d in s:
            out.add(d)
    return out


def sse_response(events: AsyncIterator[str], done: bool = True) -> Response:
    """SSE over `StreamingResponse`; an error mid-stream becomes an error event, then [DONE]."""

    async def body() -> AsyncIterator[str]:
        try:
            async with contextlib.aclosing(events) as ev:  # type: ignore[type-var]
                async for chunk in ev:
                    yield chunk
        except RequestFailed as e:
            yield sse(e.error.body())
        except OpenAIError as e:
            yield sse(e.body())
        except Exception as e:
            logger.exception("stream failed")
            yield sse(error_body(f"internal error: {e}", type="server_error"))
        if done:  # chat and text completions end with [DONE]; the Responses API does not
            yield "data: [DONE]\n\n"

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)
