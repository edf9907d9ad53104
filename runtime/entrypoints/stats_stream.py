"""The live stats feed behind `tokenspeed top`: `GET /v1/stats` and `GET /v1/stats/stream` (SSE).

The engine loop is never slowed by a watcher it does not have: snapshots are pulled from the
engine with the existing stats query (answered between two steps) only while someone asks, at
most once per `MIN_PERIOD` however many dashboards are attached, and shared between them.
Rates (tokens/s) and recent latencies are derived here from cumulative counters over a short
sliding window: the engine's token counters, and the server's TTFT/ITL histograms (which see
what clients see).

Snapshot schema (version 1), every key always present:
  server     model, version, url facts, layout, uptime_s, kv capacity, device, dtype
  engine     alive, error, num_steps
  scheduler  waiting/prefilling/decoding/retracted/running counts, preemptions, prefix-cache
             queried/hit tokens and hit rate
  kv         page_size; device and host: total/free/active/cached/evictable pages
  throughput prompt/generation/total tokens per second over the window, cumulative counts
  latency    mean TTFT and ITL (ms) of tokens streamed in the window, or null
  requests   one row per unfinished request (see EngineCore's live view); num_requests
  kernels    one row per (op, kernel) of the kernel registry's selections
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tokenspeed.runtime.entrypoints.openai_protocol import error_body

SCHEMA_VERSION = 1
MIN_PERIOD = 0.1  # the engine is asked at most this often, whatever the number of watchers
KERNELS_PERIOD = 2.0  # the kernel selection record changes rarely; refresh it this often
WINDOW_S = 2.0  # rates and recent latencies are averaged over this window

router = APIRouter()


@dataclass(frozen=True)
class _Sample:
    """Cumulative counters at one instant (monotonic time)."""

    t: float
    prompt: float
    gen: float
    ttft_sum: float
    ttft_n: float
    itl_sum: float
    itl_n: float


class RateWindow:
    """Rates and means over the last `window_s` seconds from cumulative counter samples."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self.samples: deque[_Sample] = deque()

    def add(self, s: _Sample) -> dict[str, Any]:
        """Record a sample; return throughput and latency over the window ending at it."""
        self.samples.append(s)
        # Keep the newest sample at or before the window start as the base of the differences.
        while len(self.samples) > 2 and self.samples[1].t <= s.t - self.window_s:
            self.samples.popleft()
        if self.samples[0].t < s.t - 3 * self.window_s:  # nobody watched for a while: restart
            self.samples = deque([s])
        base = self.samples[0]
        dt = s.t - base.t
        if len(self.samples) < 2 or dt <= 0:
            return _rates(None, None, None, None, 0.0)
        p = max(0.0, s.prompt - base.prompt) / dt
        g = max(0.0, s.gen - base.gen) / dt
        ttft_n, itl_n = s.ttft_n - base.ttft_n, s.itl_n - base.itl_n
        ttft = (s.ttft_sum - base.ttft_sum) / ttft_n * 1e3 if ttft_n > 0 else None
        itl = (s.itl_sum - base.itl_sum) / itl_n * 1e3 if itl_n > 0 else None
        return _rates(p, g, ttft, itl, dt)


def _rates(
    p: float | None, g: float | None, ttft: float | None, itl: float | None, dt: float
) -> dict[str, Any]:
    total = None if p is None or g is None else p + g
    return {
        "throughput": {"prompt_tokens_per_s": p, "generation_tokens_per_s": g,
                       "total_tokens_per_s": total, "window_s": dt},
        "latency": {"ttft_ms": ttft, "itl_ms": itl, "window_s": dt},
    }  # fmt: skip


def parallel_layout(args: Any) -> dict[str, Any]:
    """The parallel layout as the dashboard header shows it (resolved sizes, EP on/off)."""
    tp = int(getattr(args, "tensor_parallel_size", 1) or 1)
    dp = int(getattr(args, "data_parallel_size", 1) or 1)
    layout = {
        "world_size": int(getattr(args, "world_size", None) or tp * dp),
        "tp": tp,
        "dp": dp,
        "attn_tp": int(getattr(args, "attn_tp_size", None) or tp),
        "dense_tp": int(getattr(args, "dense_tp_size", None) or tp),
        "moe_tp": int(getattr(args, "moe_tp_size", None) or tp),
        "ep": bool(getattr(args, "enable_expert_parallel", False)),
    }
    text = f"TP{tp} DP{dp}"
    if (layout["attn_tp"], layout["dense_tp"], layout["moe_tp"]) != (tp, tp, tp):
        text += f" (attn TP{layout['attn_tp']}, dense TP{layout['dense_tp']}, " \
                f"MoE TP{layout['moe_tp']})"  # fmt: skip
    layout["text"] = text + (" EP" if layout["ep"] else "")
    return layout


def summarize_kernels(record: Any) -> list[dict[str, Any]]:
    """The registry's per-shape selections folded to one row per (op, kernel), sorted by op;
    each row keeps the reason of its newest selection."""
    if not isinstance(record, dict):
        return []
    if record.get("error"):
        return [{"op": "?", "kernel": "?", "buckets": 0, "reason": str(record["error"]),
                 "device": ""}]  # fmt: skip
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for sel in record.get("selections") or []:
        if not isinstance(sel, dict):
            continue
        key = (str(sel.get("op", "?")), str(sel.get("kernel", "?")))
        row = rows.setdefault(key, {"op": key[0], "kernel": key[1], "buckets": 0, "reason": "",
                                    "device": str(sel.get("device", "")), "time": -1.0})  # fmt: skip
        row["buckets"] += 1
        t = float(sel.get("time") or 0.0)
        if t >= row["time"]:
            row["time"], row["reason"] = t, str(sel.get("reason", ""))
    out = sorted(rows.values(), key=lambda r: (r["op"], r["kernel"]))
    for row in out:
        row.pop("time")
    return out


def _pages(raw: dict[str, Any], tier: str) -> dict[str, int]:
    return {k: int(raw.get(f"{tier}_pages_{k}", 0) or 0)
            for k in ("total", "free", "active", "cached", "evictable")}  # fmt: skip


class StatsHub:
    """Builds snapshots for every watcher of one server, sharing engine queries between them."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.window = RateWindow()
        self.seq = 0
        self._latest: dict[str, Any] | None = None
        self._latest_at = float("-inf")
        self._kernels: list[dict[str, Any]] = []
        self._kernels_at = float("-inf")
        self._lock = asyncio.Lock()

    async def snapshot(self) -> dict[str, Any]:
        """The latest snapshot, fetched from the engine if the cached one is older than
        `MIN_PERIOD`."""
        async with self._lock:
            if self._latest is None or time.monotonic() - self._latest_at >= MIN_PERIOD:
                self._latest = await self._build()
                self._latest_at = time.monotonic()
            return self._latest

    def _histogram(self, name: str) -> tuple[float, float]:
        reg, labels = self.state.metrics.registry, {"model_name": self.state.model_name}
        total = reg.get_sample_value(f"tokenspeed:{name}_sum", labels) or 0.0
        count = reg.get_sample_value(f"tokenspeed:{name}_count", labels) or 0.0
        return float(total), float(count)

    async def _build(self) -> dict[str, Any]:
        engine = self.state.llm.engine
        now = time.monotonic()
        # An empty record costs nothing to resend: ask every time until kernels were chosen.
        detail = not self._kernels or now - self._kernels_at >= KERNELS_PERIOD
        stats: dict[str, Any] = {}
        error = engine.dead
        if error is None:
            try:
                stats = await engine.stats(detail=detail, timeout_s=5.0, live=True)
            except Exception as e:  # noqa: BLE001 - a failed query is shown, not raised
                error = f"engine stats unavailable: {e or type(e).__name__}"
        if "kernels" in stats:
            self._kernels, self._kernels_at = summarize_kernels(stats["kernels"]), now
        live = stats.get("live") or {}
        raw = stats.get("scheduler") or {}
        ttft, itl = (
            self._histogram("time_to_first_token_seconds"),
            self._histogram("inter_token_latency_seconds"),
        )
        window: dict[str, Any] = _rates(None, None, None, None, 0.0)
        if error is None:
            sample = _Sample(now, float(live.get("prompt_tokens", 0)),
                             float(live.get("generation_tokens", 0)), *ttft, *itl)  # fmt: skip
            window = self.window.add(sample)
        window["throughput"]["prompt_tokens"] = int(live.get("prompt_tokens", 0))
        window["throughput"]["generation_tokens"] = int(live.get("generation_tokens", 0))
        self.seq += 1
        return {
            "version": SCHEMA_VERSION,
            "seq": self.seq,
            "time": time.time(),
            "server": self._server_info(),
            "engine": {
                "alive": error is None,
                "error": error,
                "num_steps": int(live.get("num_steps", raw.get("num_steps", 0))),
            },  # fmt: skip
            "scheduler": _scheduler(stats, raw),
            "kv": {
                "page_size": int(self.state.engine_info.get("kv_capacity", {}).get("page_size", 0)),
                "device": _pages(raw, "device"),
                "host": _pages(raw, "host"),
            },
            **window,
            "requests": list(live.get("requests", [])),
            "num_requests": int(live.get("num_requests", 0)),
            "kernels": self._kernels,
        }

    def _server_info(self) -> dict[str, Any]:
        st, info = self.state, self.state.engine_info
        return {
            "model": st.model_name,
            "version": info.get("version"),
            "started": st.started,
            "uptime_s": max(0.0, time.time() - st.started),
            "layout": parallel_layout(st.args),
            "kv_capacity": dict(info.get("kv_capacity", {})),
            "device": info.get("device"),
            "dtype": info.get("dtype"),
            "max_model_len": int(st.llm.max_model_len),
            "max_num_seqs": int(getattr(st.args, "max_num_seqs", 0) or 0),
        }


def _scheduler(stats: dict[str, Any], raw: dict[str, Any]) -> dict[str, Any]:
    queried = int(stats.get("prefix_cache_queried_tokens", 0))
    hit = int(stats.get("prefix_cache_hit_tokens", 0))
    return {
        "waiting": int(raw.get("num_waiting", 0)),
        "prefilling": int(raw.get("num_prefilling", 0)),
        "decoding": int(raw.get("num_decoding", 0)),
        "retracted": int(raw.get("num_retracted", 0)),
        "running": int(stats.get("running", 0)),
        "preemptions": int(stats.get("num_preemptions", 0)),
        "prefix_cache_queried_tokens": queried,
        "prefix_cache_hit_tokens": hit,
        "prefix_cache_hit_rate": hit / queried if queried else None,
        "cache_ops_in_flight": int(raw.get("num_cache_ops_in_flight", 0)),
    }


def _hub(request: Request) -> StatsHub:
    app_state = request.app.state
    hub = getattr(app_state, "stats_hub", None)
    if hub is None:
        hub = app_state.stats_hub = StatsHub(app_state.server)
    return hub


def _unavailable(request: Request) -> str | None:
    llm = request.app.state.server.llm
    if llm.shutting_down:
        return "the server is shutting down"
    return None


def _error(message: str, status: int = 503) -> JSONResponse:
    return JSONResponse(error_body(message, type="server_error"), status_code=status)


@router.get("/v1/stats")
async def stats_once(request: Request) -> Response:
    """One snapshot as JSON (the same document each stream event carries)."""
    reason = _unavailable(request)
    if reason is not None:
        return _error(reason)
    return JSONResponse(await _hub(request).snapshot())


@router.get("/v1/stats/stream")
async def stats_stream(
    request: Request,
    interval: float = Query(0.25, ge=MIN_PERIOD, le=10.0, description="Seconds between events."),
) -> Response:
    """Server-sent events, one `stats` event per `interval`, until the client or server leaves.

    The stream ends after an event that reports the engine dead, and when the server shuts down.
    """
    reason = _unavailable(request)
    if reason is not None:
        return _error(reason)
    hub = _hub(request)
    llm = request.app.state.server.llm

    async def events() -> AsyncIterator[str]:
        while not llm.shutting_down:
            snap = await hub.snapshot()
            data = json.dumps(snap, separators=(",", ":"))
            yield f"event: stats\nid: {snap['seq']}\ndata: {data}\n\n"
            if not snap["engine"]["alive"]:
                return
            deadline = time.monotonic() + interval
            while not llm.shutting_down and (left := deadline - time.monotonic()) > 0:
                await asyncio.sleep(min(left, 0.1))

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)
