"""EngineCore: the runtime's EventLoop as the engine process serves it.

A thin adapter: it builds the EventLoop from `ServerArgs`, turns wire params into
`SamplingParams`, turns each step's `RequestUpdate`s into plain dicts for msgpack (the sampled
token's logprob and the top-k alternatives split out), and normalises the scheduler's stats into
the names the server's metrics and `/get_server_info` use.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from tokenspeed.runtime.config import ServerArgs
from tokenspeed.runtime.engine.event_loop import EventLoop
from tokenspeed.runtime.engine.request import RequestUpdate, StepUpdates
from tokenspeed.runtime.entrypoints import kv_events
from tokenspeed.runtime.model_source import resolve_model_path
from tokenspeed.runtime.sampling import SamplingParams

logger = logging.getLogger("tokenspeed.engine")


class EngineCore:
    """Owns the EventLoop; everything the engine process asks of the runtime goes through here."""

    def __init__(self, args: ServerArgs) -> None:
        self.args = args
        self.model_path: Path = resolve_model_path(args.model, args.load_format)
        self.loop = EventLoop.from_server_args(args, self.model_path)
        self.loop.compile_grammars_in_background = True
        self._top_k: dict[str, int] = {}
        self.kv_events = kv_events.start_publisher(args.kv_events_config)
        self.live = LiveCounters()  # tokenspeed top: cumulative token counters

    # ---- facts --------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """What the server prints at startup and reports in `/get_server_info`."""
        ex = self.loop.executor
        pages = int(ex.num_device_pages)
        info: dict[str, Any] = {
            "model_path": str(self.model_path),
            "max_model_len": int(self.loop.max_model_len),
            "vocab_size": int(ex.hf_config.vocab_size),
            "device": str(ex.device),
            "dtype": str(ex.dtype).removeprefix("torch."),
            "kv_capacity": {
                "page_size": int(ex.page_size),
                "device_pages": pages,
                "device_tokens": pages * int(ex.page_size),
                "host_pages": int(ex.num_host_pages),
            },
            "eos_token_ids": sorted(self.loop.eos_token_ids),
            "kernels": _kernel_selections(),
        }
        try:
            from importlib.metadata import version

            info["version"] = version("tokenspeed")
        except Exception:
            info["version"] = None
        return info

    # ---- requests -----------------------------------------------------------------------
    def add_request(
        self, rid: str, prompt_ids: list[int], params: dict[str, Any], arrival: float | None
    ) -> None:
        """Submit; `ValueError` (bad params, can never fit) goes back to the client as a 400."""
        sp = SamplingParams(**params)
        self.loop.add_request(rid, prompt_ids, sp, arrival)
        if sp.logprobs is not None:
            self._top_k[rid] = int(sp.logprobs)

    def abort_request(self, rid: str, reason: str = "abort") -> None:
        """End a request now: `abort` (client gone) or `stop` (the server matched a stop string)."""
        if reason == "abort":
            self.loop.abort_request(rid)
        else:
            self.loop.finish_request(rid, reason)

    def has_work(self) -> bool:
        return self.loop.has_work()

    def step(self) -> dict[str, list[Any]]:
        """One scheduler plan executed; what it produced, as the body of one OUTPUTS message."""
        step = self.loop.step()
        self.publish_kv_events()
        return self.outputs(step)

    def outputs(self, step: StepUpdates) -> dict[str, list[Any]]:
        """A step's updates as the wire carries them; each request appears at most once.

        ``rids`` and ``tokens``: the step's columns (requests that gained exactly one token and
        nothing else, all of a decode step but first tokens, logprobs and finishes): a dict
        per request cost the engine process six times as much to build and pack at 1024
        decoding requests (docs/performance.md). ``block_rids`` and ``blocks``: the same for
        a speculative step's verified blocks (a token list each). ``items``: a dict per
        other update.
        """
        self.live.observe(step.column_tokens(), step.updates, self.loop.requests)
        return {"rids": step.rids, "tokens": step.tokens, "block_rids": step.block_rids,
                "blocks": step.blocks, "items": [self._item(u) for u in step.updates]}  # fmt: skip

    def _item(self, u: RequestUpdate) -> dict[str, Any]:
        if u.error is not None:  # the client gets a 400 with the message
            self._top_k.pop(u.request_id, None)
            return {"rid": u.request_id, "error": u.error}
        item: dict[str, Any] = {"rid": u.request_id, "ids": list(u.new_token_ids)}
        if u.cached_tokens is not None:  # set on a request's first token only
            item["cached_tokens"] = u.cached_tokens
        k = self._top_k.get(u.request_id)
        if k is not None and u.new_logprobs:
            item["logprobs"] = [float(e.get(t, float("-inf"))) for e, t in
                                zip(u.new_logprobs, u.new_token_ids, strict=False)]  # fmt: skip
            item["top"] = [
                sorted(e.items(), key=lambda kv: -kv[1])[:k] if k else [] for e in u.new_logprobs
            ]
        if u.finished:
            item["finish"] = u.finish_reason or "stop"
            self._top_k.pop(u.request_id, None)
            if u.stats is not None:
                stats = u.stats.as_dict()
                item["stats"] = stats
                item["cached_tokens"] = int(stats.get("cache_tokens", 0))
        return item

    # ---- KV events and the cache snapshot ----------------------------------------------
    def publish_kv_events(self) -> None:
        """Drain the scheduler's KV events (when enabled) and publish them as one batch."""
        if self.args.kv_events_config:
            events = self.loop.scheduler.drain_kv_events()
            if self.kv_events is not None:
                self.kv_events.publish(events)

    def cache_snapshot(self, max_nodes: int) -> dict[str, Any]:
        """The radix tree as plain data, consistent with the KV-event stream up to `kv_events_seq`.

        Pending events are published first, so a consumer that has every batch up to
        `kv_events_seq` holds exactly the blocks of this snapshot.
        """
        self.publish_kv_events()
        snap = self.loop.scheduler.cache_snapshot(max(1, int(max_nodes)))
        snap["kv_events_seq"] = None if self.kv_events is None else self.kv_events.last_seq
        return snap

    def close(self) -> None:
        """Stop the KV-event publisher (if any) and the grammar compile thread; the engine
        process is exiting."""
        if self.kv_events is not None:
            self.kv_events.close()
        if self.loop.grammar_backend is not None:
            self.loop.grammar_backend.close()

    # ---- stats --------------------------------------------------------------------------
    def stats(self, detail: bool = False, live: bool = False) -> dict[str, Any]:
        """The scheduler's counters under stable names (and the raw ones, for debugging).

        `detail` adds the kernel selection record (kernels are chosen as forwards run); `live`
        adds token counters and one row per unfinished request (`tokenspeed top`).
        """
        raw = {k: _plain(v) for k, v in self.loop.stats().items()}
        total, active = int(raw["device_pages_total"]), int(raw["device_pages_active"])
        return {
            "running": int(raw["num_decoding"]) + int(raw["num_prefilling"]),
            # Retracted requests wait to resume, as vLLM counts preempted ones.
            "waiting": int(raw["num_waiting"]) + int(raw["num_retracted"]),
            "device_pages_total": total,
            "device_pages_free": int(raw["device_pages_free"]),
            "device_pages_active": active,
            "device_pages_cached": int(raw["device_pages_cached"]),
            "kv_cache_usage": active / total if total else 0.0,
            "prefix_cache_queried_tokens": int(raw["prefix_cache_queried_tokens"]),
            "prefix_cache_hit_tokens": int(raw["prefix_cache_hit_tokens"]),
            "num_preemptions": int(raw["num_preemptions"]),
            "unfinished_requests": int(raw["num_unfinished"]),
            "spec_draft_tokens": int(raw["spec_draft_tokens"]),
            "spec_accepted_tokens": int(raw["spec_accepted_tokens"]),
            "spec_drafts": int(raw["spec_drafts"]),
            "scheduler": raw,
            **({"kernels": _kernel_selections()} if detail else {}),
            **({"live": self.live.view(self.loop)} if live else {}),
        }


# ---- live view for `tokenspeed top` (built only when the stats stream asks) -----------------
MAX_LIVE_ROWS = 512


class LiveCounters:
    """Cumulative prompt/generation token counts and the live request rows.

    Counting is a length per update in `step()`; the rows are built only when a stats query
    with `live` arrives between steps, so nobody watching costs the loop nothing.
    """

    def __init__(self) -> None:
        self.prompt_tokens = 0  # prompts of requests that produced their first token
        self.generation_tokens = 0

    def observe(
        self, plain_tokens: int, updates: list[RequestUpdate], requests: dict[str, Any]
    ) -> None:
        """Add one step's new tokens: ``plain_tokens`` from the step's columns, never a
        request's first (a first token carries ``cached_tokens``), and the other ``updates``,
        where a request's prompt counts when its first token arrives."""
        self.generation_tokens += plain_tokens
        for u in updates:
            n = len(u.new_token_ids)
            if not n:
                continue
            self.generation_tokens += n
            req = requests.get(u.request_id)
            if req is not None:
                first, prompt = len(req.output_ids) == n, len(req.prompt_ids)
            else:  # finished in this step: the stats hold the counts
                s = u.stats
                first = s is not None and s.output_tokens == n
                prompt = s.prompt_tokens if s is not None else 0
            if first:
                self.prompt_tokens += prompt

    def view(self, loop: EventLoop) -> dict[str, Any]:
        """Counters plus one row per unfinished request (oldest first, at most MAX_LIVE_ROWS)."""
        now = time.perf_counter()
        reqs = sorted(loop.requests.values(), key=lambda r: r.arrival)
        rows = [_live_row(loop.scheduler, r, now) for r in reqs[:MAX_LIVE_ROWS]]
        return {
            "prompt_tokens": self.prompt_tokens,
            "generation_tokens": self.generation_tokens,
            "num_steps": int(loop.num_steps),
            "num_requests": len(reqs),
            "requests": rows,
        }


def _live_row(scheduler: Any, req: Any, now: float) -> dict[str, Any]:
    """One request as the dashboard shows it (host timestamps; the scheduler's state/cache)."""
    try:
        st = scheduler.request_stats(req.request_id)
        state, cached, preempt = str(st.state), int(st.cached_tokens), int(st.preempt_count)
    except Exception:  # noqa: BLE001 - a row is best effort, never fail the loop
        state, cached, preempt = "?", 0, 0
    n_out = len(req.output_ids)
    first = req.first_token
    decode_s = now - first if first is not None else 0.0
    return {
        "id": req.request_id,
        "state": state,
        "prompt_tokens": len(req.prompt_ids),
        "cached_tokens": cached,
        "output_tokens": n_out,
        "max_new_tokens": int(req.max_new_tokens),
        "ttft_ms": (first - req.arrival) * 1e3 if first is not None else None,
        "tokens_per_s": (n_out - 1) / decode_s if n_out > 1 and decode_s > 0 else None,
        "preemptions": preempt,
        "age_s": max(0.0, now - req.arrival),
    }


def _plain(v: Any) -> Any:
    """Scheduler stats as msgpack-friendly values."""
    if isinstance(v, bool | int | float | str) or v is None:
        return v
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    try:
        return int(v)
    except (TypeError, ValueError):
        return str(v)


def _kernel_selections() -> dict[str, Any]:
    """The kernel registry's selection record (what ran, and why), as plain data."""
    try:
        from tokenspeed.kernels import kernel_info

        return _plain(kernel_info())
    except Exception as e:  # noqa: BLE001 - a kernels problem must not hide the rest of the info
        return {"error": f"the kernel selection record is unavailable: {e}"}
