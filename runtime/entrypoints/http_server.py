"""The FastAPI app: OpenAI-compatible endpoints plus health, metrics and server info.

Handlers only translate: OpenAI request -> `GenerationRequest` -> `AsyncLLM.generate` ->
OpenAI response (JSON or SSE). Every error leaves as OpenAI's `{"error": {...}}` shape, including
FastAPI's own validation errors (400 instead of 422) and unknown routes, so one bad request
never affects anyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from tokenspeed.runtime.entrypoints import cache_routes, responses
from tokenspeed.runtime.entrypoints.async_llm import GenerationRequest, RequestFailed, SequenceDelta
from tokenspeed.runtime.entrypoints.chat_serving import ChatServing
from tokenspeed.runtime.entrypoints.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    OpenAIError,
    TokenizeRequest,
    new_id,
    now,
    usage_dict,
    validation_message,
)
from tokenspeed.runtime.entrypoints.serving_common import (
    ServerState,
    collect,
    collect_or_abort,
    engine_params,
    error_response,
    sse,
    sse_response,
)
from tokenspeed.runtime.entrypoints.stats_stream import router as stats_router

__all__ = ["ServerState", "build_app", "engine_params"]

logger = logging.getLogger("tokenspeed.server")


async def _merge(
    streams: list[AsyncIterator[SequenceDelta]], n: int
) -> AsyncIterator[SequenceDelta]:
    """Interleave several prompts' streams; choice index = prompt index * n + sequence index."""
    if len(streams) == 1:
        async with contextlib.aclosing(streams[0]) as s:  # type: ignore[type-var]
            async for d in s:
                yield d
        return
    queue: asyncio.Queue[tuple[int, SequenceDelta | BaseException | None]] = asyncio.Queue()

    async def pump(p: int, stream: AsyncIterator[SequenceDelta]) -> None:
        try:
            async with contextlib.aclosing(stream) as s:  # type: ignore[type-var]
                async for d in s:
                    queue.put_nowait((p, d))
        except Exception as e:
            queue.put_nowait((p, e))
        finally:
            queue.put_nowait((p, None))

    tasks = [asyncio.create_task(pump(p, s)) for p, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            p, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                item.index += p * n
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def build_app(state: ServerState) -> FastAPI:
    """The app with every route and the OpenAI-shaped error handlers."""
    app = FastAPI(title="TokenSpeed", docs_url=None, redoc_url=None)
    app.state.server = state
    app.include_router(cache_routes.router)  # GET /cache/snapshot (tokenspeed inspect-cache)
    app.include_router(stats_router)  # GET /v1/stats, /v1/stats/stream (tokenspeed top)
    app.include_router(responses.router)  # POST /v1/responses, GET/DELETE /v1/responses/{id}
    llm = state.llm
    chat = ChatServing(state)
    app.state.chat = chat  # the Responses routes answer through it too

    @app.exception_handler(OpenAIError)
    async def _openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestFailed)
    async def _request_failed(_: Request, exc: RequestFailed) -> JSONResponse:
        return error_response(exc.error)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(list(exc.errors()))
        return error_response(OpenAIError(message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        etype = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(OpenAIError(str(exc.detail), status=exc.status_code, type=etype))

    @app.exception_handler(Exception)
    async def _internal_error(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("internal error")
        return error_response(OpenAIError(f"internal error: {exc}", status=500,
                                           type="server_error"))  # fmt: skip

    check_model = state.check_model

    # ---- info endpoints -------------------------------------------------------------------
    @app.get("/health")
    async def health() -> Response:
        if llm.engine.dead is not None or llm.shutting_down:
            reason = llm.engine.dead or "shutting down"
            return error_response(OpenAIError(reason, status=503, type="server_error"))
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": state.model_name,
            "object": "model",
            "created": int(state.started),
            "owned_by": "tokenspeed",
            "max_model_len": llm.max_model_len,
        }
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    async def metrics() -> Response:
        with contextlib.suppress(Exception):
            state.metrics.engine.snapshot = await llm.engine.stats()
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        try:
            stats = await llm.engine.stats(detail=True)
        except Exception as e:
            raise OpenAIError(f"engine stats unavailable: {e}", status=503,
                              type="server_error") from None  # fmt: skip
        info = dict(state.engine_info)
        return {
            "version": info.pop("version", None),
            "model": state.model_name,
            "server_args": state.args.to_dict(),
            "max_model_len": llm.max_model_len,
            "kv_capacity": info.pop("kv_capacity", {}),
            "kernels": stats.pop("kernels", None) or info.pop("kernels", {}),
            "engine": info,
            "cache": stats,
        }

    @app.post("/abort_request")
    async def abort_request(request: Request) -> dict[str, Any]:
        """Abort a running request by the `id` of its response (`chatcmpl-...`, `cmpl-...`)."""
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise OpenAIError("malformed JSON body") from None
        rid = body.get("rid") if isinstance(body, dict) else None
        if not isinstance(rid, str):
            raise OpenAIError('expected {"rid": "<response id>"}', param="rid")
        aborted = await llm.abort(rid)
        if not aborted:
            raise OpenAIError(f"no running request with id {rid!r}", status=404,
                              type="not_found_error", param="rid")  # fmt: skip
        return {"rid": rid, "aborted_sequences": aborted}

    # ---- tokenizer (vLLM's endpoints: count tokens, check a template) -------------------
    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        check_model(body.model)
        text, add = body.prompt, body.add_special_tokens
        if body.messages is not None:  # the chat template brings its own special tokens
            try:
                text = state.tokenizer.apply_chat_template(
                    [m.for_template() for m in body.messages],
                    add_generation_prompt=body.add_generation_prompt, tools=body.tools,
                    **dict(body.chat_template_kwargs or {}),
                )  # fmt: skip
            except Exception as e:
                raise OpenAIError(f"could not apply the chat template: {e}",
                                  param="messages") from None  # fmt: skip
            add = bool(add)
        assert text is not None
        tokens = state.tokenizer.encode(text, add_special_tokens=True if add is None else add)
        return {"count": len(tokens), "max_model_len": llm.max_model_len, "tokens": tokens}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        check_model(body.model)
        bad = [t for t in body.tokens if t >= state.vocab_size]
        if bad:
            raise OpenAIError(f"token id {bad[0]} is outside the vocabulary "
                              f"(size {state.vocab_size})", param="tokens")  # fmt: skip
        return {"prompt": state.tokenizer.decode(body.tokens, skip_special_tokens=False)}

    # ---- chat completions -----------------------------------------------------------------
    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        check_model(body.model)
        run = chat.start(body)
        if body.stream:
            return sse_response(sse(c) async for c in chat.chunks(run))
        response = await chat.complete(run, request)
        return Response(status_code=499) if response is None else JSONResponse(response)

    # ---- text completions -----------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        check_model(body.model)
        prompts: list[list[int]] = []
        texts: list[str] = []
        for p in body.prompts():
            if isinstance(p, str):
                prompts.append(state.tokenizer.encode(p))
                texts.append(p)
            else:
                bad = [t for t in p if t >= state.vocab_size]
                if bad:
                    raise OpenAIError(f"token id {bad[0]} is outside the vocabulary "
                                      f"(size {state.vocab_size})", param="prompt")  # fmt: skip
                prompts.append(list(p))
                texts.append(state.tokenizer.decode(p, skip_special_tokens=False))
        if any(not ids for ids in prompts):
            raise OpenAIError("the prompt encodes to no tokens", param="prompt")
        budgets = [llm.check_length(len(ids), body.max_tokens, "max_tokens") for ids in prompts]
        gens = [
            GenerationRequest(
                prompt_ids=ids,
                params=engine_params(body, mt, body.logprobs),
                stop=list(body.stop or []),
                include_stop=body.include_stop_str_in_output,
                n=body.n,
                skip_special_tokens=body.skip_special_tokens,
            )  # fmt: skip
            for ids, mt in zip(prompts, budgets, strict=True)
        ]
        rid, created = new_id("cmpl"), now()
        total = body.n * len(gens)
        stream = _merge([llm.generate(g, rid, p) for p, g in enumerate(gens)], body.n)
        prompt_tokens = sum(len(ids) for ids in prompts)
        if body.stream:
            return sse_response(completion_stream(body, rid, created, stream, prompt_tokens, total))
        result = await collect_or_abort(request, collect(stream, total))
        if result is None:
            return Response(status_code=499)
        choices = []
        for i in range(total):
            prefix = texts[i // body.n] if body.echo else ""
            lp = None
            if body.logprobs is not None:
                lp = completion_logprobs(result.ids[i], result.lp[i], result.top[i], len(prefix))
            choices.append({"index": i, "text": prefix + result.text[i], "logprobs": lp,
                            "finish_reason": result.finish[i]})  # fmt: skip
        cached = sum(result.cached[p * body.n] for p in range(len(gens)))
        return JSONResponse({
            "id": rid, "object": "text_completion", "created": created, "model": state.model_name,
            "choices": choices, "usage": usage_dict(prompt_tokens, sum(result.tokens), cached),
        })  # fmt: skip

    def completion_logprobs(
        ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]], offset: int
    ) -> dict[str, Any]:
        tokens = [state.token_text(t) for t in ids]
        offsets = []
        for s in tokens:
            offsets.append(offset)
            offset += len(s)
        return {
            "tokens": tokens,
            "token_logprobs": lps,
            "top_logprobs": [{state.token_text(i): v for i, v in top} for top in tops],
            "text_offset": offsets,
        }

    async def completion_stream(
        body: CompletionRequest, rid: str, created: int, stream: AsyncIterator[SequenceDelta],
        prompt_tokens: int, total: int,
    ) -> AsyncIterator[str]:  # fmt: skip
        base = {"id": rid, "object": "text_completion", "created": created,
                "model": state.model_name}  # fmt: skip
        tokens = [0] * total
        cached = [0] * total
        offsets = [0] * total

        def usage() -> dict[str, Any]:  # the usage field of a content chunk
            if body.continuous_usage:
                return {"usage": usage_dict(prompt_tokens, sum(tokens), sum(cached[:: body.n]))}
            return {"usage": None} if body.include_usage else {}

        async for d in stream:
            tokens[d.index], cached[d.index] = d.completion_tokens, d.cached_tokens
            if not d.text and d.finish_reason is None and body.logprobs is None:
                continue  # tokens that end mid-character: nothing to show yet
            lp = None
            if body.logprobs is not None:
                lp = completion_logprobs(d.token_ids, d.logprobs or [], d.top_logprobs or [],
                                         offsets[d.index])  # fmt: skip
            offsets[d.index] += len(d.text)
            choice = {"index": d.index, "text": d.text, "logprobs": lp,
                      "finish_reason": d.finish_reason}  # fmt: skip
            yield sse({**base, "choices": [choice], **usage()})
        if body.include_usage:
            usage = usage_dict(prompt_tokens, sum(tokens), sum(cached[:: body.n]))
            yield sse({**base, "choices": [], "usage": usage})

    return app
