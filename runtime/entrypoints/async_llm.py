"""AsyncLLM: the server-side half of the engine (prompts in, text deltas out).

It renders chat templates, tokenises, checks lengths, submits sequences to the engine process
and turns each sequence's token deltas into text deltas: incremental detokenisation, stop
strings with hold-back (a matched stop string aborts the sequence in the engine and is never
emitted), usage and metrics. `n > 1` submits the first sequence alone and the others once its
prompt is in the prefix cache, so they reuse its pages instead of computing the prompt again.
A consumer that goes away (client disconnect, cancellation) aborts its sequences.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from tokenspeed.runtime.entrypoints.detokenizer import IncrementalDetokenizer, StopStringMatcher
from tokenspeed.runtime.entrypoints.engine_client import EngineClient, EngineDeadError
from tokenspeed.runtime.entrypoints.metrics import ServerMetrics
from tokenspeed.runtime.entrypoints.openai_protocol import OpenAIError

logger = logging.getLogger("tokenspeed.server")


class TokenizerLike(Protocol):
    """What the server needs from the runtime's tokenizer."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


@dataclass
class GenerationRequest:
    """One prompt's generation, resolved from an OpenAI request."""

    prompt_ids: list[int]
    params: dict[str, Any]  # engine-side sampling params (the runtime's SamplingParams fields)
    stop: list[str] = field(default_factory=list)
    include_stop: bool = False  # the matched stop string stays in the output
    n: int = 1
    skip_special_tokens: bool = True


@dataclass
class SequenceDelta:
    """New output of one sequence (choice `index`) since its previous delta."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    finish_reason: str | None = None
    completion_tokens: int = 0
    cached_tokens: int = 0


class RequestFailed(Exception):
    """A sequence could not complete; `error` carries the HTTP status and OpenAI error shape."""

    def __init__(self, error: OpenAIError) -> None:
        super().__init__(error.message)
        self.error = error


class _Sequence:
    """Per-sequence state: queue from the engine, detokenizer, stop matcher, counters."""

    def __init__(self, llm: AsyncLLM, rid: str, index: int, req: GenerationRequest) -> None:
        self.llm, self.rid, self.index, self.req = llm, rid, index, req
        self.detok = IncrementalDetokenizer(llm.tokenizer, req.prompt_ids, req.skip_special_tokens)
        self.stops = StopStringMatcher(req.stop, req.include_stop)
        self.queue: asyncio.Queue[dict[str, Any]] | None = None
        self.tokens = 0
        self.cached = 0
        self.done = False
        self.engine_finished = False
        self.first_output = asyncio.Event()
        self.submitted = 0.0
        self.last_output: float | None = None

    async def submit(self) -> None:
        self.submitted = time.time()
        params = dict(self.req.params)
        params["seed"] = _per_sequence_seed(params.get("seed"), self.index)
        # perf_counter is the system-wide monotonic clock on Linux and macOS, so the engine's
        # queue time starts when the server received the request.
        self.queue = await self.llm.engine.add_request(
            self.rid, self.req.prompt_ids, params, time.perf_counter()
        )

    async def deltas(self) -> AsyncIterator[SequenceDelta]:
        """Yield text deltas until the sequence finishes; aborts it if the consumer leaves."""
        assert self.queue is not None
        try:
            while not self.done:
                items = [await self.queue.get()]
                while not self.queue.empty():
                    items.append(self.queue.get_nowait())
                delta = self._apply(items)
                if delta is not None:
                    yield delta
        finally:
            self.first_output.set()
            if not self.done or not self.engine_finished:
                # Client gone, error, or a stop string the engine has not seen: end it so
                # its pages return to the pool now.
                reason = "stop" if self.stops.stopped else "abort"
                if not self.done:
                    self._finish("abort", None)
                await self.llm.engine.abort([self.rid], reason)
            else:
                self.llm.engine.release(self.rid)

    def _apply(self, items: list[dict[str, Any]]) -> SequenceDelta | None:
        """Fold a batch of engine items into one delta."""
        out = SequenceDelta(self.index, "", [], cached_tokens=self.cached)
        want_lp = self.req.params.get("logprobs") is not None
        if want_lp:
            out.logprobs, out.top_logprobs = [], []
        finish: str | None = None
        stats: dict[str, Any] | None = None
        for item in items:
            if "error" in item:
                self.done = True
                status, etype = (
                    (503, "server_error") if item.get("fatal") else (400, "invalid_request_error")
                )
                raise RequestFailed(OpenAIError(item["error"], status=status, type=etype))
            self._observe_timing(item)
            self.cached = item.get("cached_tokens", self.cached)
            ids: list[int] = item.get("ids") or []
            # The engine's "stop" ends on a stop token (EOS, stop_token_ids, a grammar's end):
            # its text is not output, as in vLLM, unless include_stop_str_in_output.
            hide_last = item.get("finish") == "stop" and not self.req.include_stop
            stopped = self._consume(out, ids, item if want_lp else None, hide_last)
            if stopped:
                finish = "stop"
                break
            if item.get("finish"):
                finish, stats = item["finish"], item.get("stats")
                break
        if finish is not None and not self.stops.stopped:
            # The engine finished it: release any held-back text (unless it was a stop string).
            text, hit = self.stops.push(self.detok.flush())
            out.text += text if hit else text + self.stops.flush()
            finish = "stop" if hit else finish
            self.engine_finished = True
        out.cached_tokens = self.cached
        out.completion_tokens = self.tokens
        if finish is not None:
            out.finish_reason = finish
            self._finish(finish, stats)
        if not out.text and not out.token_ids and finish is None:
            return None
        return out

    def _consume(
        self, out: SequenceDelta, ids: list[int], lp: dict[str, Any] | None, hide_last: bool
    ) -> bool:
        """Detokenise new ids into `out` (all but the last with ``hide_last``, which still
        counts as a token); True when a stop string ended the sequence."""
        if not ids:
            return False
        # Without stop strings the whole delta is decoded at once; with them, token by token,
        # so the token that completes a stop string is the last one counted.
        chunks = [ids] if not self.stops.stops else [[t] for t in ids]
        for k, chunk in enumerate(chunks):
            shown = chunk[:-1] if hide_last and k == len(chunks) - 1 else chunk
            text, stopped = self.stops.push(self.detok.push(shown) if shown else "")
            out.text += text
            out.token_ids.extend(chunk)
            self.tokens += len(chunk)
            if lp is not None and out.logprobs is not None and out.top_logprobs is not None:
                lo, hi = (0, len(ids)) if len(chunks) == 1 else (k, k + 1)
                out.logprobs.extend(lp["logprobs"][lo:hi])
                out.top_logprobs.extend(
                    [[(int(i), float(v)) for i, v in row] for row in lp["top"][lo:hi]]
                )
            if stopped:
                return True
        return False

    def _observe_timing(self, item: dict[str, Any]) -> None:
        if not item.get("ids"):
            return
        received = item.get("received", time.time())
        metrics = self.llm.metrics
        if self.last_output is None:
            metrics.ttft.observe(max(0.0, received - self.submitted))
            self.first_output.set()
        else:
            metrics.itl.observe(max(0.0, received - self.last_output))
        self.last_output = received

    def _finish(self, reason: str, stats: dict[str, Any] | None) -> None:
        self.done = True
        e2e = time.time() - self.submitted
        prompt = len(self.req.prompt_ids)
        # The per-request stats line (--enable-log-request-stats) is the engine's: it holds
        # the timestamps, and it also sees requests this process has stopped listening to.
        self.llm.metrics.observe_finished(reason, prompt, self.tokens, e2e, stats)


def _per_sequence_seed(seed: int | None, index: int) -> int | None:
    """With a seed, choice i uses seed + i so `n` seeded choices differ yet reproduce."""
    return None if seed is None else (seed + index) % (2**63)


class AsyncLLM:
    """Prompts to streams of `SequenceDelta`s, over the engine process."""

    def __init__(
        self,
        engine: EngineClient,
        tokenizer: Any,
        metrics: ServerMetrics,
        *,
        max_model_len: int,
        page_size: int,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.max_model_len = max_model_len
        self.page_size = page_size
        self.shutting_down = False
        self._active: set[_Sequence] = set()
        self._by_request: dict[str, list[_Sequence]] = {}

    def check_length(self, prompt_len: int, max_tokens: int | None, param: str) -> int:
        """The output budget; a 400 when the prompt plus `max_tokens` cannot fit."""
        room = self.max_model_len - prompt_len
        if room < 1:
            raise OpenAIError(
                f"the prompt has {prompt_len} tokens, more than the model's maximum context "
                f"length of {self.max_model_len} tokens minus one for the output",
                param="messages" if param == "max_completion_tokens" else "prompt",
            )
        if max_tokens is None:
            return room
        if max_tokens > room:
            raise OpenAIError(
                f"this model's maximum context length is {self.max_model_len} tokens; the "
                f"prompt has {prompt_len} and {param}={max_tokens} asks for {max_tokens} more",
                param=param,
            )
        return max_tokens

    async def generate(
        self, req: GenerationRequest, request_id: str | None = None, prompt_index: int = 0
    ) -> AsyncIterator[SequenceDelta]:
        """Deltas of all `req.n` sequences, interleaved as they arrive.

        `request_id` (the OpenAI response id) names the sequences in the engine
        (`{request_id}-{prompt_index}-{i}`), so `abort()` can find them.
        """
        if self.shutting_down:
            raise RequestFailed(OpenAIError("the server is shutting down", status=503,
                                            type="server_error"))  # fmt: skip
        if self.engine.dead is not None:
            raise RequestFailed(OpenAIError(self.engine.dead, status=503, type="server_error"))
        request_id = request_id or f"req-{uuid.uuid4().hex}"
        seqs = [_Sequence(self, f"{request_id}-{prompt_index}-{i}", i, req) for i in range(req.n)]
        merged: asyncio.Queue[SequenceDelta | BaseException | None] = asyncio.Queue()

        async def pump(seq: _Sequence, after: _Sequence | None) -> None:
            try:
                if after is not None:
                    await after.first_output.wait()
                await seq.submit()
                async for delta in seq.deltas():
                    merged.put_nowait(delta)
            except BaseException as e:  # hand the failure to the consumer, then stop
                merged.put_nowait(e)
                if isinstance(e, asyncio.CancelledError):
                    raise
            finally:
                seq.first_output.set()
                merged.put_nowait(None)

        # Later sequences wait for the first one's first token only when the prompt has a
        # full page to share; shorter prompts have nothing to reuse.
        share = req.n > 1 and len(req.prompt_ids) >= self.page_size
        self._active.update(seqs)
        self._by_request.setdefault(request_id, []).extend(seqs)
        tasks = [asyncio.create_task(pump(s, seqs[0] if share and s.index else None)) for s in seqs]
        try:
            running = len(tasks)
            while running:
                item = await merged.get()
                if item is None:
                    running -= 1
                elif isinstance(item, BaseException):
                    if isinstance(item, RequestFailed):
                        raise item
                    if isinstance(item, EngineDeadError):
                        raise RequestFailed(OpenAIError(str(item), status=503, type="server_error"))
                    if not isinstance(item, asyncio.CancelledError):
                        raise item
                else:
                    yield item
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(BaseException):
                    await t
            self._active.difference_update(seqs)
            left = [s for s in self._by_request.pop(request_id, []) if s not in seqs]
            if left:
                self._by_request[request_id] = left

    def shutdown_streams(self) -> None:
        """End every in-flight sequence with an error (the server is stopping)."""
        self.shutting_down = True
        for seq in list(self._active):
            if seq.queue is not None and not seq.done:
                seq.queue.put_nowait({"rid": seq.rid, "error": "the server is shutting down",
                                      "fatal": True})  # fmt: skip

    async def abort(self, request_id: str) -> int:
        """Abort a running request by its response id; its streams end with `abort`.

        Returns how many sequences were still running.
        """
        rids = [s.rid for s in self._by_request.get(request_id, []) if not s.done]
        if rids:
            # Keep the queues: the engine's `abort` finish flows back and ends each stream.
            await self.engine.abort(rids, keep_queues=True)
        return len(rids)
