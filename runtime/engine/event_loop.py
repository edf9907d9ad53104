"""EventLoop: submit, plan, execute (cache ops, then the forward), stop checks, events back.

One ``step()`` is one scheduler plan. The loop is single-threaded and owns the engine-side
request table; the scheduler owns resources (pages, slots) and decides who runs; the executor
runs exactly what the plan says.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tokenspeed.runtime.engine.request import Request, RequestUpdate
from tokenspeed.runtime.forward_batch import ForwardMode
from tokenspeed.runtime.model_executor import ExecutorConfig, ModelExecutor, StepOutput
from tokenspeed.runtime.sampling import SamplingParams

logger = logging.getLogger("tokenspeed.engine")


def _sched() -> Any:
    """The scheduler module, imported on first use (it is a compiled extension)."""
    import tokenspeed.scheduler as sched

    return sched


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
    ) -> None:
        """``protocol`` is the module defining RequestSpec and the event classes; it defaults
        to ``tokenspeed.scheduler`` (tests pass a pure-Python stand-in)."""
        self.executor = executor
        self.scheduler = scheduler
        self._protocol = protocol
        self.max_model_len = executor.max_model_len
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.requests: dict[str, Request] = {}
        self.slot_owner: dict[int, Request] = {}
        self.rng = np.random.default_rng(seed)
        self.log_request_stats = log_request_stats
        self.num_steps = 0
        self._pending_updates: list[RequestUpdate] = []

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
        )
        return cls(
            executor,
            sched.Scheduler(config),
            eos_token_ids=executor.hf_config.eos_token_ids(),
            seed=int(args.seed),
            log_request_stats=bool(getattr(args, "enable_log_request_stats", False)),
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
        req = Request(
            request_id=request_id,
            prompt_ids=prompt,
            params=params,
            seed=seed,
            stop_ids=frozenset(stop_ids),
            max_new_tokens=max_new,
        )
        if arrival is not None:
            req.arrival = arrival
        sched = self._proto()
        try:
            self.scheduler.submit_requests([sched.RequestSpec(request_id, prompt, max_new)])
        except (RuntimeError, ValueError) as exc:
            raise ValueError(str(exc)) from exc
        self.requests[request_id] = req

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
    def step(self) -> list[RequestUpdate]:
        """Run one plan; return what each touched request gained (and who finished)."""
        sched = self._proto()
        updates, self._pending_updates = self._pending_updates, []
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
        if (
            fwd is not None
            and ForwardMode.of(fwd.mode) is not ForwardMode.IDLE
            and len(fwd.request_ids)
        ):
            self._bind_slots(fwd)
            result = self.executor.execute(fwd)
            events.extend(self._process(fwd, result, updates))
        if events:
            self.scheduler.advance(events)
        self.num_steps += 1
        return updates

    def _bind_slots(self, fwd: Any) -> None:
        """Install sampling state for requests new to their pool slot; note first scheduling."""
        now = time.perf_counter()
        slots = np.asarray(fwd.request_pool_indices)
        for rid, slot in zip(fwd.request_ids, slots.tolist(), strict=True):
            req = self.requests[rid]
            if req.first_scheduled is None:
                req.first_scheduled = now
            if self.slot_owner.get(slot) is not req:
                self.slot_owner[slot] = req
                req.slot = slot
                self.executor.install_request(
                    slot, req.params, req.seed, req.prompt_ids, req.output_ids, sorted(req.stop_ids)
                )

    def _process(self, fwd: Any, result: StepOutput, updates: list[RequestUpdate]) -> list[Any]:
        """Append sampled tokens, check stop conditions, build the scheduler events."""
        sched = self._proto()
        now = time.perf_counter()
        events: list[Any] = []
        finished: list[tuple[Request, RequestUpdate]] = []
        tokens = result.tokens.tolist()
        # One batched event per forward when the scheduler offers it, else one per request.
        batched = hasattr(sched, "ForwardResult") and hasattr(fwd, "forward_id")
        if batched:
            events.append(sched.ForwardResult(fwd.forward_id, tokens, []))
        for j, (rid, tok) in enumerate(zip(result.request_ids, tokens, strict=True)):
            req = self.requests[rid]
            req.output_ids.append(tok)
            if req.first_token is None:
                req.first_token = now
            update = RequestUpdate(rid, [tok], self._logprobs(req, result, j, tok), False, None)
            updates.append(update)
            if not batched:
                events.append(sched.ExtendResult(rid, [tok]))
            n = len(req.output_ids)
            if tok in req.stop_ids and n >= req.params.min_tokens:
                update.finish_reason = "stop"
            elif n >= req.max_new_tokens:
                update.finish_reason = "length"
            if update.finish_reason is not None:
                update.finished = True
                finished.append((req, update))
        for req, update in finished:
            stats = self._scheduler_request_stats(req.request_id)
            events.append(sched.Finish(req.request_id, update.finish_reason))
            self._finalise(req, str(update.finish_reason), stats)
            update.stats = req.stats
        return events

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

    def _scheduler_request_stats(self, request_id: str) -> Any:
        try:
            return self.scheduler.request_stats(request_id)
        except Exception:  # noqa: BLE001 - stats are best effort, never fail a request
            return None

    def _finalise(self, req: Request, reason: str, scheduler_stats: Any) -> None:
        req.finish_reason = reason
        req.finished_at = time.perf_counter()
        stats = req.compute_stats(scheduler_stats)
        if req.slot is not None and self.slot_owner.get(req.slot) is req:
            del self.slot_owner[req.slot]
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
        return out
