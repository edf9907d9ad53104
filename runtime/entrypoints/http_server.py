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
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tokenspeed.runtime.config import ServerArgs
from tokenspeed.runtime.entrypoints import cache_routes
from tokenspeed.runtime.entrypoints.async_llm import (
    AsyncLLM,
    GenerationRequest,
    RequestFailed,
    SequenceDelta,
)
from tokenspeed.runtime.entrypoints.metrics import ServerMetrics
from tokenspeed.runtime.entrypoints.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    OpenAIError,
    SamplingFields,
    TokenizeRequest,
    error_body,
    new_id,
    now,
    usage_dict,
    validation_message,
)
from tokenspeed.runtime.entrypoints.stats_stream import router as stats_router
from tokenspeed.runtime.entrypoints.tool_choice import ForcedTools, forced_message, message_delta
from tokenspeed.runtime.parsers import REASONING_PARSERS, TOOL_CALL_PARSERS
from tokenspeed.runtime.parsers.chat import ChatOutputParser
from tokenspeed.runtime.parsers.tool_calls import tool_call

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

    def token_text(self, token_id: int) -> str:
        """A token's own text, for logprobs (cached: the vocabulary is finite)."""
        text = self._token_text.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_text[token_id] = text
        return text


def _error_response(err: OpenAIError) -> JSONResponse:
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


def _merge_deltas(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two parser deltas as one: texts joined, tool calls in order."""
    out = dict(a)
    for key, value in b.items():
        out[key] = out[key] + value if key in out else value
    return out


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


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


async def _until_disconnect(request: Request) -> None:
    """Return when the client closes the connection (the body is already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _collect_or_abort(request: Request, coro: Any) -> Any:
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


class _Choices:
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


def build_app(state: ServerState) -> FastAPI:
    """The app with every route and the OpenAI-shaped error handlers."""
    app = FastAPI(title="TokenSpeed", docs_url=None, redoc_url=None)
    app.state.server = state
    app.include_router(cache_routes.router)  # GET /cache/snapshot (tokenspeed inspect-cache)
    app.include_router(stats_router)  # GET /v1/stats, /v1/stats/stream (tokenspeed top)
    llm = state.llm
    reasoning_parser = REASONING_PARSERS.get(state.args.reasoning_parser or "")
    tool_parser = TOOL_CALL_PARSERS.get(state.args.tool_call_parser or "")

    def thinks(body: ChatCompletionRequest) -> bool:
        """Whether the server's thinking model thinks for this request (hybrid models switch
        it with a chat-template argument)."""
        return reasoning_parser is not None and reasoning_parser.thinks(body.chat_template_kwargs)

    def parses_tools(body: ChatCompletionRequest) -> bool:
        """Tools are offered and the model may choose (`tool_choice` absent or "auto")."""
        return (
            tool_parser is not None
            and bool(body.tools)
            and body.tool_choice in (None, "auto")
            and body.forced_tools is None
        )

    def output_parser(body: ChatCompletionRequest) -> ChatOutputParser | None:
        """One choice's parser, where the server has parsers this request uses: reasoning
        (unless the request turned thinking off), and tool calls (``parses_tools``). A forced
        tool call splits off reasoning itself (`forced_answer`)."""
        if body.forced_tools is not None or not (thinks(body) or parses_tools(body)):
            return None
        return ChatOutputParser(
            reasoning_parser() if reasoning_parser and thinks(body) else None,
            tool_parser() if tool_parser and parses_tools(body) else None,
        )

    @app.exception_handler(OpenAIError)
    async def _openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestFailed)
    async def _request_failed(_: Request, exc: RequestFailed) -> JSONResponse:
        return _error_response(exc.error)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(list(exc.errors()))
        return _error_response(OpenAIError(message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        etype = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error_response(OpenAIError(str(exc.detail), status=exc.status_code, type=etype))

    @app.exception_handler(Exception)
    async def _internal_error(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("internal error")
        return _error_response(OpenAIError(f"internal error: {exc}", status=500,
                                           type="server_error"))  # fmt: skip

    def check_model(name: str | None) -> None:
        if name is not None and name != state.model_name:
            raise OpenAIError(
                f"the model {name!r} does not exist; this server serves {state.model_name!r}",
                status=404,
                param="model",
                code="model_not_found",
            )

    # ---- info endpoints -------------------------------------------------------------------
    @app.get("/health")
    async def health() -> Response:
        if llm.engine.dead is not None or llm.shutting_down:
            reason = llm.engine.dead or "shutting down"
            return _error_response(OpenAIError(reason, status=503, type="server_error"))
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
        if body.tool_choice == "auto" and tool_parser is None:
            raise OpenAIError(
                'tool_choice "auto" needs a tool-call parser (--tool-call-parser); this server '
                'has none. Use "required" or a named function to get tool_calls',
                param="tool_choice",
            )
        messages = [m.for_template() for m in body.messages]
        kwargs = dict(body.chat_template_kwargs or {})
        try:
            prompt_ids = state.tokenizer.encode_chat(
                messages, add_generation_prompt=body.add_generation_prompt, tools=body.tools,
                **kwargs,
            )  # fmt: skip
        except Exception as e:  # a template that rejects these messages is the client's error
            raise OpenAIError(f"could not apply the chat template: {e}", param="messages") from None
        max_tokens = llm.check_length(len(prompt_ids), body.output_limit, "max_completion_tokens"
                                      if body.max_completion_tokens else "max_tokens")  # fmt: skip
        params = engine_params(body, max_tokens, body.num_logprobs)
        params["thinking"] = thinks(body)  # a grammar holds the answer after the thinking
        # a tool-call parser whose tags are special tokens (DeepSeek, Kimi) must see them
        needs_tags = parses_tools(body) and bool(tool_parser and tool_parser.needs_special_tokens)
        gen = GenerationRequest(
            prompt_ids=prompt_ids,
            params=params,
            stop=list(body.stop or []),
            include_stop=body.include_stop_str_in_output,
            n=body.n,
            skip_special_tokens=body.skip_special_tokens and not needs_tags,
        )
        rid, created = new_id("chatcmpl"), now()
        stream = llm.generate(gen, rid)
        if body.stream:
            return _sse_response(chat_stream(body, gen, rid, created, stream))
        result = await _collect_or_abort(request, collect(stream, body.n))
        if result is None:
            return Response(status_code=499)
        forced = body.forced_tools
        choices = []
        for i in range(body.n):
            message: dict[str, Any] = {"role": "assistant", "content": result.text[i]}
            finish = result.finish[i]
            parser = output_parser(body)
            if forced is not None:  # the output is the call's JSON: answer with tool_calls
                message, finish = forced_answer(body, forced, result.text[i], finish)
            elif parser is not None:  # reasoning and/or the model's own tool calls
                message, finish = parser.message(result.text[i], finish)
            lp = (
                chat_logprobs(result.ids[i], result.lp[i], result.top[i]) if body.logprobs else None
            )
            choices.append(
                {"index": i, "message": message, "logprobs": lp, "finish_reason": finish}
            )
        return JSONResponse({
            "id": rid, "object": "chat.completion", "created": created, "model": state.model_name,
            "choices": choices,
            "usage": usage_dict(len(prompt_ids), sum(result.tokens), result.cached[0]),
        })  # fmt: skip

    def forced_answer(
        body: ChatCompletionRequest, forced: ForcedTools, text: str, finish: str
    ) -> tuple[dict[str, Any], str]:
        """A forced call's message; a thinking model's block (before the grammar took hold)
        becomes `reasoning_content`."""
        if reasoning_parser is None or not thinks(body):
            return forced_message(forced, text, finish)
        reasoning, answer = reasoning_parser.split(text)
        message, finish = forced_message(forced, answer or "", finish)
        return {**message, "reasoning_content": reasoning}, finish

    def chat_logprobs(
        ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]]
    ) -> dict[str, Any]:
        def entry(t: int, lp: float) -> dict[str, Any]:
            s = state.token_text(t)
            return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}

        content = []
        for t, lp, top in zip(ids, lps, tops, strict=False):
            e = entry(t, lp)
            e["top_logprobs"] = [entry(i, v) for i, v in top]
            content.append(e)
        return {"content": content, "refusal": None}

    async def chat_stream(
        body: ChatCompletionRequest, gen: GenerationRequest, rid: str, created: int,
        stream: AsyncIterator[SequenceDelta],
    ) -> AsyncIterator[str]:  # fmt: skip
        base = {"id": rid, "object": "chat.completion.chunk", "created": created,
                "model": state.model_name}  # fmt: skip
        tokens = [0] * body.n
        cached = 0

        def usage() -> dict[str, Any]:  # the usage field of a content chunk
            if body.continuous_usage:
                return {"usage": usage_dict(len(gen.prompt_ids), sum(tokens), cached)}
            return {"usage": None} if body.include_usage else {}

        forced = body.forced_tools
        held = [""] * body.n  # "required": the calls are parsed once the output is complete
        parsers = [output_parser(body) for _ in range(body.n)]
        # a forced call from a thinking model: its thinking block first, then the call
        thinkers = [reasoning_parser() if forced and reasoning_parser and thinks(body) else None
                    for _ in range(body.n)]  # fmt: skip
        for i in range(body.n):
            first: dict[str, Any] = {"role": "assistant", "content": ""}
            if forced is not None and forced.name is not None:  # arguments stream after this
                call = tool_call(forced.name, "")
                first = {"role": "assistant", "content": None, "tool_calls": [{"index": 0, **call}]}
            choice = {"index": i, "delta": first, "logprobs": None, "finish_reason": None}
            yield _sse({**base, "choices": [choice], **usage()})
        async for d in stream:
            tokens[d.index] = d.completion_tokens
            cached = d.cached_tokens if d.index == 0 else cached
            if not d.text and d.finish_reason is None and not body.logprobs:
                continue  # tokens that end mid-character: nothing to show yet
            delta: dict[str, Any] = {"content": d.text} if d.text or d.finish_reason is None else {}
            finish = d.finish_reason
            if forced is not None:
                thought, text = "", d.text
                if (thinker := thinkers[d.index]) is not None:  # its block, then the call
                    thought, text = thinker.push(text)
                    if finish is not None:
                        more_thought, more_text = thinker.flush()
                        thought, text = thought + more_thought, text + more_text
                if forced.name is not None:  # the arguments stream as they come
                    arguments = {"index": 0, "function": {"arguments": text}}
                    delta = {"tool_calls": [arguments]} if text else {}
                    finish = forced.finish_reason if finish == "stop" else finish
                else:  # "required": held back, sent whole once complete
                    held[d.index] += text
                    delta = {}
                    if finish is not None:
                        message, finish = forced_message(forced, held[d.index], finish)
                        delta = message_delta(message)
                if thought:
                    delta = {"reasoning_content": thought, **delta}
                if not delta and finish is None and not body.logprobs:
                    continue
            elif (parser := parsers[d.index]) is not None:
                delta = parser.push(d.text)
                if finish is not None:
                    delta = _merge_deltas(delta, parser.finish())
                    finish = parser.finish_reason(finish)
                elif not delta and not body.logprobs:
                    continue  # held back (a tag may be starting)
            lp = (chat_logprobs(d.token_ids, d.logprobs or [], d.top_logprobs or [])
                  if body.logprobs else None)  # fmt: skip
            choice = {"index": d.index, "delta": delta, "logprobs": lp, "finish_reason": finish}
            yield _sse({**base, "choices": [choice], **usage()})
        if body.include_usage:
            usage = usage_dict(len(gen.prompt_ids), sum(tokens), cached)
            yield _sse({**base, "choices": [], "usage": usage})

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
            return _sse_response(
                completion_stream(body, rid, created, stream, prompt_tokens, total)
            )
        result = await _collect_or_abort(request, collect(stream, total))
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
            yield _sse({**base, "choices": [choice], **usage()})
        if body.include_usage:
            usage = usage_dict(prompt_tokens, sum(tokens), sum(cached[:: body.n]))
            yield _sse({**base, "choices": [], "usage": usage})

    return app


async def collect(stream: AsyncIterator[SequenceDelta], count: int) -> _Choices:
    """Run a generation to the end and accumulate it per choice."""
    out = _Choices(count)
    async with contextlib.aclosing(stream) as s:  # type: ignore[type-var]
        async for d in s:
            out.add(d)
    return out


def _sse_response(events: AsyncIterator[str]) -> Response:
    """SSE over `StreamingResponse`; an error mid-stream becomes an error event, then [DONE]."""

    async def body() -> AsyncIterator[str]:
        try:
            async with contextlib.aclosing(events) as ev:  # type: ignore[type-var]
                async for chunk in ev:
                    yield chunk
        except RequestFailed as e:
            yield _sse(e.error.body())
        except OpenAIError as e:
            yield _sse(e.body())
        except Exception as e:
            logger.exception("stream failed")
            yield _sse(error_body(f"internal error: {e}", type="server_error"))
        yield "data: [DONE]\n\n"

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)
