"""EventLoop: submit, plan, execute (cache ops, then the forward), stop checks, events back.

One ``step()`` is one scheduler plan. The loop is single-threaded and owns the engine-side
request table; the scheduler owns resources (pages, slots) and decides who runs; the executor
runs exactly what the plan says.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import time
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tokenspeed.runtime.engine.request import Request, RequestUpdate, StepUpdates
from tokenspeed.runtime.forward_batch import ForwardMode, segments
from tokenspeed.runtime.grammar.backend import GrammarBackend
from tokenspeed.runtime.model_executor import ExecutorConfig, ModelExecutor, StepOutput
from tokenspeed.runtime.sampling import SamplingParams

logger = logging.getLogger("tokenspeed.engine")


def _sched() -> Any:
    """The scheduler module, imported on first use (it is a compiled extension)."""
    import tokenspeed.scheduler as sched

    return sched


#: Stop sets up to this many ids are checked with one numpy compare per step; a request with
#: more (rare: long stop_token_ids lists) is checked in Python.
_MAX_STOP_COLUMNS = 16


class EventLoop:
    """Drives one scheduler and one executor; returns per-step request updates."""

    def __init__(
        self,
        executor: ModelExecutor,
        scheduler: Any,
        *,
        eos_token_ids: Iterable[int] = (),
        seed: int = 0,
        log_request_stats: bool = False,
        protocol: Any = None,
        grammar_backend: GrammarBackend | None = None,
    ) -> None:
        """``protocol`` is the module defining RequestSpec and the event classes (RequestSpec,
        ForwardResult, Finish, Abort, WriteBackDone, LoadBackDone); it defaults to
        ``tokenspeed.scheduler``. ``grammar_backend`` compiles structured-output requests'
        grammars (without one, such requests are refused)."""
        self.executor = executor
        self.grammar_backend = grammar_backend
        # A request whose grammar is new compiles on the backend's thread (the server sets
        # this, so one large schema does not stall every other request's steps); it reaches
        # the scheduler once compiled. Offline, compiling at submit keeps errors synchronous.
        self.compile_grammars_in_background = False
        self._compiling: dict[str, concurrent.futures.Future[Any]] = {}
        self.scheduler = scheduler
        self._protocol = protocol
        self.max_model_len = executor.max_model_len
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.requests: dict[str, Request] = {}
        self.rng = np.random.default_rng(seed)
        self.log_request_stats = log_request_stats
        self.num_steps = 0
        self._pending_updates: list[RequestUpdate] = []
        # Per request-pool slot state, so the per-step path is numpy gathers over the sampled
        # slots instead of a dict lookup and a few attribute reads per request. A slot's row
        # is (re)written when a request is bound to it (its first extend in that slot: a
        # request reaches a slot only through admission, which always starts with an extend,
        # so decode rows never need binding) and cleared when it finishes.
        self._slot_req = np.empty(0, dtype=object)  # Request | None
        self._slot_rid = np.empty(0, dtype=object)  # its request id (str)
        self._slot_out = np.empty(0, dtype=object)  # its output_ids list (appended in place)
        self._slot_live = np.zeros(0, dtype=bool)
        self._out_len = np.zeros(0, dtype=np.int64)  # == len(output_ids)
        self._max_new = np.zeros(0, dtype=np.int64)
        self._min_tokens = np.zeros(0, dtype=np.int64)
        self._want_lp = np.zeros(0, dtype=bool)
        self._wide_stop = np.zeros(0, dtype=bool)  # stop set too wide for the table
        self._stop_tab = np.full((0, 0), -1, dtype=np.int64)  # stop ids, padded with -1
        # speculative decoding's per-request counts since the request was bound to the slot,
        # added to the Request when it leaves the slot (``_flush_spec``)
        self._spec_drafted = np.zeros(0, dtype=np.int64)
        self._spec_accepted = np.zeros(0, dtype=np.int64)

    @classmethod
    def from_server_args(cls, args: Any, model_path: str | Path) -> EventLoop:
        """Build executor and scheduler from a ``ServerArgs`` and a resolved model directory."""
        executor = ModelExecutor(ExecutorConfig.from_server_args(args, model_path))
        sched = _sched()
        config = sched.SchedulerConfig(
            page_size=executor.page_size,
            num_device_pages=executor.num_device_pages,
            num_host_pages=executor.num_host_pages,
            max_scheduled_tokens=int(args.chunked_prefill_size),
            max_batch_size=int(args.max_num_seqs),
            max_model_len=executor.max_model_len,
            enable_prefix_cache=bool(args.enable_prefix_caching),
            enable_mixed_batch=bool(args.enable_mixed_batch),
            enable_kv_events=bool(getattr(args, "kv_events_config", None)),
            # speculative decoding: each decode step may verify this many tokens
            decode_input_tokens=executor.spec_tokens,
        )
        eos = executor.hf_config.eos_token_ids()
        tokenizer_dir = Path(args.tokenizer) if args.tokenizer else Path(model_path)
        return cls(
            executor,
            sched.Scheduler(config),
            eos_token_ids=eos,
            seed=int(args.seed),
            log_request_stats=bool(getattr(args, "enable_log_request_stats", False)),
            grammar_backend=GrammarBackend(
                tokenizer_dir, executor.hf_config.vocab_size, eos, args.reasoning_parser
            ),
        )

    # ---- requests -----------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        arrival: float | None = None,
    ) -> None:
        """Validate and submit a request; raises ``ValueError`` if it can never run."""
        if request_id in self.requests:
            raise ValueError(f"duplicate request id {request_id!r}")
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("the prompt is empty")
        vocab = self.executor.hf_config.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise ValueError(f"logit_bias token ids must be in [0, {vocab})")
        room = self.max_model_len - len(prompt)
        if room < 1:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens; the maximum model length is "
                f"{self.max_model_len}, leaving no room to generate"
            )
        max_new = room if params.max_tokens is None else min(params.max_tokens, room)
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= self.eos_token_ids
        seed = params.seed if params.seed is not None else int(self.rng.integers(0, 2**62))
        grammar, compiling = None, None
        if params.grammar is not None:
            backend = self.grammar_backend
            if backend is None:
                raise ValueError("structured outputs are not available in this engine")
            if self.compile_grammars_in_background and backend.ready(params.grammar) is None:
                compiling = backend.compile_in_background(params.grammar)
            else:  # at hand, or compiled now (offline)
                grammar = backend.matcher(params.grammar, sorted(stop_ids), params.thinking)
        req = Request(
            request_id=request_id,
            prompt_ids=prompt,
            params=params,
            seed=seed,
            stop_ids=frozenset(stop_ids),
            max_new_tokens=max_new,
            grammar=grammar,
        )
        if arrival is not None:
            req.arrival = arrival
        if compiling is not None:  # submitted once compiled (``_admit_compiled``)
            self.requests[request_id] = req
            self._compiling[request_id] = compiling
            return
        self._submit(req)
        self.requests[request_id] = req

    def _submit(self, req: Request) -> None:
        """Hand a request to the scheduler; ``ValueError`` if it can never run."""
        spec = self._proto().RequestSpec(req.request_id, req.prompt_ids, req.max_new_tokens)
        try:
            self.scheduler.submit_requests([spec])
        except (RuntimeError, ValueError) as exc:
            raise ValueError(str(exc)) from exc

    def _admit_compiled(self, updates: list[RequestUpdate]) -> None:
        """Submit the requests whose grammars finished compiling; fail those that did not
        compile. With nothing else to run, wait a little for a compile instead of spinning."""
        if len(self._compiling) == len(self.requests) and not updates:
            concurrent.futures.wait(list(self._compiling.values()), timeout=0.01,
                                    return_when=concurrent.futures.FIRST_COMPLETED)  # fmt: skip
        for rid, future in list(self._compiling.items()):
            if not future.done():
                continue
            del self._compiling[rid]
            req = self.requests[rid]
            try:
                assert self.grammar_backend is not None
                req.grammar = self.grammar_backend.matcher_for(
                    future.result(), sorted(req.stop_ids), req.params.thinking
                )
                self._submit(req)
            except Exception as exc:  # a bad grammar (GrammarError), or it can never fit
                if not isinstance(exc, ValueError):
                    logger.exception("request %s: grammar compile failed", rid)
                del self.requests[rid]
                updates.append(RequestUpdate(rid, [], None, True, "abort", error=str(exc)))

    def abort_request(self, request_id: str) -> Request | None:
        """Stop a request now (client went away); it reports finish reason ``abort``."""
        return self._end(request_id, "abort", event="abort")

    def finish_request(self, request_id: str, reason: str = "stop") -> Request | None:
        """End a request for a reason found outside the loop (a stop string)."""
        return self._end(request_id, reason, event="finish")

    def _end(self, request_id: str, reason: str, event: str) -> Request | None:
        req = self.requests.get(request_id)
        if req is None or req.finished:
            return None
        if self._compiling.pop(request_id, None) is not None:  # never reached the scheduler
            self._finalise(req, reason, None)
            self._pending_updates.append(
                RequestUpdate(request_id, [], None, True, reason, req.stats)
            )
            return req
        sched = self._proto()
        stats = self._scheduler_request_stats(request_id)
        ev = sched.Abort(request_id) if event == "abort" else sched.Finish(request_id, reason)
        self.scheduler.advance([ev])
        self._finalise(req, reason, stats)
        self._pending_updates.append(RequestUpdate(request_id, [], None, True, reason, req.stats))
        return req

    def _proto(self) -> Any:
        if self._protocol is None:
            self._protocol = _sched()
        return self._protocol

    def has_work(self) -> bool:
        return bool(self.requests) or bool(self._pending_updates)

    # ---- the step -----------------------------------------------------------------------
    def step(self) -> StepUpdates:
        """Run one plan; return what each touched request gained (and who finished)."""
        sched = self._proto()
        out = StepUpdates(updates=self._pending_updates)
        self._pending_updates = []
        updates = out.updates
        if self._compiling:
            self._admit_compiled(updates)
        plan = self.scheduler.next_execution_plan()
        events: list[Any] = []
        for op in plan.cache_ops:
            kind = type(op).__name__
            if kind.startswith("WriteBack"):
                self.executor.write_back(op.device_pages, op.host_pages)
                events.append(sched.WriteBackDone(op.op_id))
            elif kind.startswith("LoadBack"):
                self.executor.load_back(op.host_pages, op.device_pages)
                events.append(sched.LoadBackDone(op.op_id))
            else:
                raise RuntimeError(f"unknown cache op {kind}")
        fwd = plan.forward
        if fwd is not None:
            mode = ForwardMode.of(fwd.mode)
            if mode is not ForwardMode.IDLE and fwd.batch_size:
                self._bind_slots(fwd, mode)
                result = self.executor.execute(fwd)
                events.extend(self._process(fwd, result, out))
        if events:
            self.scheduler.advance(events)
        self.num_steps += 1
        return out

    def _bind_slots(self, fwd: Any, mode: ForwardMode) -> None:
        """Install sampling state for requests new to their pool slot; note first scheduling.

        Only extend rows can be new to a slot (see ``__init__``): a DECODE forward binds
        nothing, a MIXED one only its rows after ``num_decode``. That keeps the pure-decode
        step free of ``fwd.request_ids``, which builds one Python string per request.
        """
        if mode is ForwardMode.DECODE:
            return
        start = int(getattr(fwd, "num_decode", 0)) if mode is ForwardMode.MIXED else 0
        ids = fwd.request_ids
        if start >= len(ids):
            return
        slots = np.asarray(fwd.request_pool_indices)[start:].tolist()
        self._ensure_slots(max(slots) + 1)
        now = time.perf_counter()
        for rid, slot in zip(ids[start:], slots, strict=True):
            req = self.requests[rid]
            if req.first_scheduled is None:
                req.first_scheduled = now
            if self._slot_req[slot] is not req:
                self._install(slot, req)

    def _install(self, slot: int, req: Request) -> None:
        """Bind ``req`` to ``slot``: the executor's sampling state and the per-slot rows."""
        old = self._slot_req[slot]
        if old is not None:
            self._flush_spec(old, slot)
            if old.slot == slot:
                old.slot = None  # it was retracted from this slot; it re-binds wherever it resumes
        if req.slot is not None and req.slot < len(self._slot_req):
            self._flush_spec(req, req.slot)  # resumed elsewhere: what it verified before
        req.slot = slot
        stop_ids = sorted(req.stop_ids)
        self.executor.install_request(
            slot, req.params, req.seed, req.prompt_ids, req.output_ids, stop_ids, req.grammar
        )
        self._slot_req[slot] = req
        self._slot_rid[slot] = req.request_id
        self._slot_out[slot] = req.output_ids
        self._slot_live[slot] = True
        self._out_len[slot] = len(req.output_ids)
        self._max_new[slot] = req.max_new_tokens
        self._min_tokens[slot] = req.params.min_tokens
        self._want_lp[slot] = req.params.logprobs is not None
        width = self._stop_tab.shape[1]
        if len(stop_ids) > width and len(stop_ids) <= _MAX_STOP_COLUMNS:
            grown = np.full((len(self._stop_tab), len(stop_ids)), -1, dtype=np.int64)
            grown[:, :width] = self._stop_tab
            self._stop_tab, width = grown, len(stop_ids)
        self._stop_tab[slot] = -1
        self._wide_stop[slot] = len(stop_ids) > width
        if not self._wide_stop[slot]:
            self._stop_tab[slot, : len(stop_ids)] = stop_ids

    def _ensure_slots(self, n: int) -> None:
        """Grow the per-slot arrays to at least ``n`` slots (the scheduler's max batch size)."""
        have = len(self._slot_req)
        if n <= have:
            return
        n = max(n, 2 * have, 64)

        def grow(a: np.ndarray, fill: Any) -> np.ndarray:
            out = np.full((n, *a.shape[1:]), fill, dtype=a.dtype)
            out[:have] = a
            return out

        self._slot_req = grow(self._slot_req, None)
        self._slot_rid = grow(self._slot_rid, None)
        self._slot_out = grow(self._slot_out, None)
        self._slot_live = grow(self._slot_live, False)
        self._out_len = grow(self._out_len, 0)
        self._max_new = grow(self._max_new, 0)
        self._min_tokens = grow(self._min_tokens, 0)
        self._want_lp = grow(self._want_lp, False)
        self._wide_stop = grow(self._wide_stop, False)
        self._stop_tab = grow(self._stop_tab, -1)
        self._spec_drafted = grow(self._spec_drafted, 0)
        self._spec_accepted = grow(self._spec_accepted, 0)

    def _flush_spec(self, req: Request, slot: int) -> None:
        """Add the slot's speculative counts to ``req`` (if it is the slot's request) and zero
        them, so a count is added once whoever flushes."""
        if self._slot_req[slot] is req:
            req.spec_drafted += int(self._spec_drafted[slot])
            req.spec_accepted += int(self._spec_accepted[slot])
            self._spec_drafted[slot] = self._spec_accepted[slot] = 0

    def _process(self, fwd: Any, result: StepOutput, out: StepUpdates) -> list[Any]:
        """Append sampled tokens, check stop conditions, build the scheduler events.

        One ``ForwardResult`` reports the whole forward (the scheduler walks its sampled
        requests in C++); stop checks are numpy over the sampled slots; the tokens are
        appended by a C-level map and the step's columns (``out.rids``, ``out.tokens``) filled
        by list extends, and Python builds a ``RequestUpdate`` only for the few that got their
        first token, asked for logprobs or finished.
        """
        if result.counts is not None:
            return self._process_verified(fwd, result, out)
        sched = self._proto()
        rows = np.asarray(result.rows, dtype=np.int64)
        if len(rows) == 0:
            return []
        tokens = np.asarray(result.tokens, dtype=np.int64)
        events: list[Any] = [sched.ForwardResult(fwd.forward_id, tokens)]
        slots = np.asarray(fwd.request_pool_indices, dtype=np.int64)[rows]
        if not self._slot_live[slots].all():  # (an IndexError if beyond every bound slot)
            raise RuntimeError("a sampled request's pool slot is not bound to a request")
        # Output lengths and stop conditions, vectorised over the sampled requests.
        prev = self._out_len[slots]
        n_out = prev + 1
        self._out_len[slots] = n_out
        stop = self._stop_hits(slots, tokens) & (n_out >= self._min_tokens[slots])
        if result.grammar_done is not None:  # a complete grammar ends its request
            stop |= result.grammar_done
        done = stop | (n_out >= self._max_new[slots])
        # The per-request part: C-level maps over object-array gathers.
        tok_list = tokens.tolist()
        rid_list = self._slot_rid[slots].tolist()
        deque(map(list.append, self._slot_out[slots].tolist(), tok_list), maxlen=0)
        # The few that need more: first token (time it, report the cached prefix), logprobs,
        # and finishing; the rest go out as columns.
        first = np.flatnonzero(prev == 0).tolist()
        lp = np.flatnonzero(self._want_lp[slots]).tolist() if result.logprobs is not None else []
        ended = np.flatnonzero(done).tolist()
        if not (first or lp or ended):
            out.rids += rid_list
            out.tokens += tok_list
        else:
            plain = np.ones(len(slots), dtype=bool)
            plain[first + lp + ended] = False
            keep = plain.tolist()
            out.rids += itertools.compress(rid_list, keep)
            out.tokens += itertools.compress(tok_list, keep)
            special = np.flatnonzero(~plain).tolist()
            step_updates = {j: RequestUpdate(rid_list[j], [tok_list[j]]) for j in special}
            out.updates += step_updates.values()
            reqs = self._slot_req[slots]
            now = time.perf_counter()
            for j in first:
                req = reqs[j]
                req.first_token = now
                step_updates[j].cached_tokens = self._cached_tokens(req.request_id)
            for j in lp:
                step_updates[j].new_logprobs = self._logprobs(reqs[j], result, j, tok_list[j])
            for j in ended:
                reason = "stop" if stop[j] else "length"
                events.append(self._finish_in_step(reqs[j], step_updates[j], reason))
        return events

    def _process_verified(self, fwd: Any, result: StepOutput, out: StepUpdates) -> list[Any]:
        """``_process`` for a step that verified drafts (speculative decoding): several
        tokens per request. Each request's tokens are checked in order, as one-token steps
        would check them: its output ends at the first stop token (once ``min_tokens`` is met)
        or at its token limit, and the tokens after are dropped (their KV lies past the
        request's length, unused). The checks are numpy over the step's tokens; the blocks go
        out as columns (``out.block_rids``, ``out.blocks``) but for first tokens, logprobs
        and finishes, as in ``_process``."""
        sched = self._proto()
        rows = np.asarray(result.rows, dtype=np.int64)
        counts = np.asarray(result.counts, dtype=np.int64)
        slots = np.asarray(fwd.request_pool_indices, dtype=np.int64)[rows]
        if not self._slot_live[slots].all():
            raise RuntimeError("a sampled request's pool slot is not bound to a request")
        tokens = np.asarray(result.tokens, dtype=np.int64)
        # Each token's request (j, an index into rows), its place in the block, and the
        # output length it would make.
        starts = np.cumsum(counts) - counts
        owner, within = segments(counts)
        token_slots = slots[owner]
        prev = self._out_len[slots]
        out_len = prev[owner] + within + 1
        stop = self._stop_hits(token_slots, tokens) & (out_len >= self._min_tokens[token_slots])
        if result.grammar_done is not None:  # grammar rows are single rows: their one token
            stop |= np.asarray(result.grammar_done, dtype=bool)[owner] & (within == 0)
        ends = np.flatnonzero(stop | (out_len >= self._max_new[token_slots]))
        # A block ends at its first end (the rest dropped); ``ends`` is in token order.
        ended, first = np.unique(owner[ends], return_index=True)
        end_at = ends[first]
        kept = counts.copy()
        kept[ended] = end_at - starts[ended] + 1
        self._out_len[slots] = prev + kept
        if result.drafted is not None:
            self._spec_drafted[slots] += np.asarray(result.drafted, dtype=np.int64)
            self._spec_accepted[slots] += np.maximum(kept - 1, 0)
        kept_tokens = tokens[within < kept[owner]]
        # The per-request part: list slices and C-level maps.
        flat = kept_tokens.tolist()
        bounds = np.cumsum(kept).tolist()
        blocks = [flat[e - n : e] for e, n in zip(bounds, kept.tolist(), strict=True)]
        deque(map(list.extend, self._slot_out[slots].tolist(), blocks), maxlen=0)
        rid_list = self._slot_rid[slots].tolist()
        first_token = np.flatnonzero(prev == 0).tolist()
        lp = np.flatnonzero(self._want_lp[slots]).tolist() if result.logprobs is not None else []
        events: list[Any] = [sched.ForwardResult(fwd.forward_id, kept_tokens.astype(np.int32),
                                                 kept.tolist())]  # fmt: skip
        if not (first_token or lp or len(ended)):
            out.block_rids += rid_list
            out.blocks += blocks
            return events
        plain = np.ones(len(rows), dtype=bool)
        plain[first_token + lp + ended.tolist()] = False
        keep = plain.tolist()
        out.block_rids += itertools.compress(rid_list, keep)
        out.blocks += itertools.compress(blocks, keep)
        special = np.flatnonzero(~plain).tolist()
        step_updates = {j: RequestUpdate(rid_list[j], blocks[j]) for j in special}
        out.updates += step_updates.values()
        reqs = self._slot_req[slots]
        now = time.perf_counter()
        for j in first_token:
            reqs[j].first_token = now
            step_updates[j].cached_tokens = self._cached_tokens(rid_list[j])
        block_starts = starts.tolist()
        for j in lp:  # each kept token's entry (the result's rows are its tokens)
            step_updates[j].new_logprobs = [
                entry
                for k, tok in enumerate(blocks[j])
                for entry in self._logprobs(reqs[j], result, block_starts[j] + k, tok) or []
            ]
        stopped = stop[end_at].tolist()
        for j, by_stop in zip(ended.tolist(), stopped, strict=True):
            reason = "stop" if by_stop else "length"
            events.append(self._finish_in_step(reqs[j], step_updates[j], reason))
        return events

    def _finish_in_step(self, req: Request, update: RequestUpdate, reason: str) -> Any:
        """End a request whose step's tokens finished it: its update carries the reason and
        its stats; returns the scheduler's ``Finish`` event for the step's batch."""
        update.finished, update.finish_reason = True, reason
        stats = self._scheduler_request_stats(req.request_id)
        self._finalise(req, reason, stats)
        update.stats = req.stats
        return self._proto().Finish(req.request_id, reason)

    def _stop_hits(self, slots: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Whether each token is one of its request's stop ids (``slots``: the requests' pool
        slots, one per token): one numpy compare against the stop table, Python only for a
        request whose stop set is too wide for it."""
        width = self._stop_tab.shape[1]
        if width == 1:  # the common case: one EOS id
            stop = self._stop_tab[slots, 0] == tokens
        elif width:
            stop = (self._stop_tab[slots] == tokens[:, None]).any(axis=1)
        else:
            stop = np.zeros(len(slots), dtype=bool)
        wide = self._wide_stop[slots]
        if wide.any():
            for j in np.flatnonzero(wide).tolist():
                stop[j] = int(tokens[j]) in self._slot_req[slots[j]].stop_ids
        return stop

    def _logprobs(
        self, req: Request, result: StepOutput, j: int, tok: int
    ) -> list[dict[int, float]] | None:
        if req.params.logprobs is None or result.logprobs is None:
            return None
        entry = {tok: float(result.logprobs[j])}
        k = req.params.logprobs
        if k and result.top_ids is not None and result.top_logprobs is not None:
            for t, v in zip(
                result.top_ids[j, :k].tolist(), result.top_logprobs[j, :k].tolist(), strict=True
            ):
                entry.setdefault(int(t), float(v))
        req.logprobs.append(entry)
        return [entry]

    def _cached_tokens(self, request_id: str) -> int | None:
        """The scheduler's prefix-cache hit for a request (device + host), in tokens."""
        stats = self._scheduler_request_stats(request_id)
        return None if stats is None else int(stats.cached_tokens)

    def _scheduler_request_stats(self, request_id: str) -> Any:
        """The scheduler's RequestStats, or None for a request it never admitted (aborted
        while its grammar compiled)."""
        try:
            return self.scheduler.request_stats(request_id)
        except KeyError:  # the scheduler's UnknownRequestError
            return None

    def _finalise(self, req: Request, reason: str, scheduler_stats: Any) -> None:
        req.finish_reason = reason
        req.finished_at = time.perf_counter()
        slot = req.slot
        bound = slot is not None and slot < len(self._slot_req) and self._slot_req[slot] is req
        if bound:
            self._flush_spec(req, slot)  # before the stats, which read the counts
        stats = req.compute_stats(scheduler_stats)
        if bound:
            self._slot_req[slot] = self._slot_rid[slot] = self._slot_out[slot] = None
            self._slot_live[slot] = False
            if req.grammar is not None:
                self.executor.release_grammar(slot)
        del self.requests[req.request_id]
        if self.log_request_stats:
            logger.info("request %s finished (%s): %s", req.request_id, reason, stats.line())

    # ---- introspection ------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Scheduler counters plus engine facts, as plain data."""
        raw = self.scheduler.stats()
        out = {
            k: getattr(raw, k)
            for k in dir(raw)
            if not k.startswith("_") and not callable(getattr(raw, k))
        }
        out["num_steps"] = self.num_steps
        out["num_unfinished"] = len(self.requests)
        out["spec_draft_tokens"] = self.executor.spec_drafted
        out["spec_accepted_tokens"] = self.executor.spec_accepted
        out["spec_drafts"] = self.executor.spec_blocks
        return out
