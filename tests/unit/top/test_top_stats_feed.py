"""The server's side of `tokenspeed top`: engine live counters and the stats hub's snapshots."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from tokenspeed.runtime.engine.request import RequestStats, RequestUpdate
from tokenspeed.runtime.entrypoints.engine_core import LiveCounters
from tokenspeed.runtime.entrypoints.metrics import ServerMetrics
from tokenspeed.runtime.entrypoints.stats_stream import (
    RateWindow,
    StatsHub,
    _Sample,
    parallel_layout,
    summarize_kernels,
)


# ---- engine side ----------------------------------------------------------------------------
def _req(rid: str, prompt: int, out: int, arrival: float, first: float | None) -> Any:
    return SimpleNamespace(request_id=rid, prompt_ids=[1] * prompt, output_ids=[2] * out,
                           arrival=arrival, first_token=first, max_new_tokens=64)  # fmt: skip


def test_live_counters_count_generated_tokens_and_prompts_at_first_token() -> None:
    c = LiveCounters()
    live = {"a": _req("a", 10, 1, 0.0, 1.0), "b": _req("b", 7, 5, 0.0, 1.0)}
    done = RequestStats(prompt_tokens=30, output_tokens=1)
    c.observe(4, [  # 4 one-token updates of decoding requests: their tokens count
        RequestUpdate("a", [5], None, False, None),  # a's first token: its prompt counts
        RequestUpdate("b", [5], None, False, None),  # b is decoding: only the token counts
        RequestUpdate("c", [5], None, True, "length", done),  # finished on its first token
        RequestUpdate("d", [], None, True, "abort"),  # aborted: nothing new
    ], live)  # fmt: skip
    assert (c.prompt_tokens, c.generation_tokens) == (40, 7)


class _Scheduler:
    def request_stats(self, rid: str) -> Any:
        if rid == "broken":
            raise RuntimeError("gone")
        return SimpleNamespace(state="Decoding", cached_tokens=16, preempt_count=1)


def test_live_view_rows_oldest_first_with_rates(monkeypatch: pytest.MonkeyPatch) -> None:
    import tokenspeed.runtime.entrypoints.engine_core as core

    monkeypatch.setattr(core.time, "perf_counter", lambda: 10.0)
    loop = SimpleNamespace(
        scheduler=_Scheduler(),
        num_steps=42,
        requests={
            "new": _req("new", 4, 0, 9.0, None),
            "old": _req("old", 20, 5, 2.0, 6.0),
            "broken": _req("broken", 3, 1, 5.0, 8.0),
        },
    )
    view = LiveCounters().view(loop)  # type: ignore[arg-type]
    assert view["num_steps"] == 42 and view["num_requests"] == 3
    old, broken, new = view["requests"]
    assert [old["id"], broken["id"], new["id"]] == ["old", "broken", "new"]
    assert old == {"id": "old", "state": "Decoding", "prompt_tokens": 20, "cached_tokens": 16,
                   "output_tokens": 5, "max_new_tokens": 64, "ttft_ms": 4000.0,
                   "tokens_per_s": 1.0, "preemptions": 1, "age_s": 8.0}  # fmt: skip
    assert broken["state"] == "?" and broken["tokens_per_s"] is None  # one token: no rate yet
    assert new["ttft_ms"] is None and new["output_tokens"] == 0


# ---- server side ----------------------------------------------------------------------------
def test_rate_window_differences_over_the_window() -> None:
    w = RateWindow(window_s=2.0)
    first = w.add(_Sample(0.0, 0, 0, 0.0, 0, 0.0, 0))
    assert first["throughput"]["total_tokens_per_s"] is None
    r = w.add(_Sample(1.0, 100, 50, 0.3, 3, 0.5, 50))
    assert r["throughput"]["prompt_tokens_per_s"] == pytest.approx(100.0)
    assert r["throughput"]["generation_tokens_per_s"] == pytest.approx(50.0)
    assert r["latency"]["ttft_ms"] == pytest.approx(100.0)
    assert r["latency"]["itl_ms"] == pytest.approx(10.0)
    # The base is the newest sample at or before the window start (t=1.0 for t=4.0; t=0 is
    # dropped); no new first token in the window -> no TTFT.
    w.add(_Sample(2.5, 100, 150, 0.3, 3, 1.5, 150))
    r = w.add(_Sample(4.0, 100, 250, 0.3, 3, 2.5, 250))
    assert r["throughput"]["window_s"] == pytest.approx(3.0)
    assert r["throughput"]["generation_tokens_per_s"] == pytest.approx(200 / 3.0)
    assert r["throughput"]["prompt_tokens_per_s"] == 0.0
    assert r["latency"]["ttft_ms"] is None
    # After a long gap (nobody watching) the old counters are no base: rates start over.
    r = w.add(_Sample(60.0, 500, 900, 0.3, 3, 2.5, 250))
    assert r["throughput"]["total_tokens_per_s"] is None
    r = w.add(_Sample(61.0, 500, 1000, 0.3, 3, 2.5, 250))
    assert r["throughput"]["generation_tokens_per_s"] == pytest.approx(100.0)


def test_summarize_kernels_folds_shape_buckets() -> None:
    sel = [
        {"op": "attention.decode", "kernel": "k1", "reason": "old", "time": 1.0, "device": "c"},
        {"op": "attention.decode", "kernel": "k1", "reason": "new", "time": 2.0, "device": "c"},
        {"op": "attention.decode", "kernel": "k2", "reason": "tuned", "time": 1.5},
        {"op": "norm.rms", "kernel": "k3", "reason": "only", "time": 0.5},
    ]
    rows = summarize_kernels({"selections": sel})
    assert [(r["op"], r["kernel"], r["buckets"], r["reason"]) for r in rows] == [
        ("attention.decode", "k1", 2, "new"),
        ("attention.decode", "k2", 1, "tuned"),
        ("norm.rms", "k3", 1, "only"),
    ]
    assert summarize_kernels({"error": "no kernels"})[0]["reason"] == "no kernels"
    assert summarize_kernels(None) == [] and summarize_kernels({}) == []


def test_parallel_layout_text() -> None:
    ns = SimpleNamespace
    assert parallel_layout(ns(tensor_parallel_size=1, data_parallel_size=1))["text"] == "TP1 DP1"
    layout = parallel_layout(ns(tensor_parallel_size=4, data_parallel_size=2, moe_tp_size=1,
                                enable_expert_parallel=True))  # fmt: skip
    assert layout["world_size"] == 8 and layout["moe_tp"] == 1
    assert layout["text"] == "TP4 DP2 (attn TP4, dense TP4, MoE TP1) EP"


@dataclass
class _Engine:
    """Answers stats like the engine process does; counts the queries."""

    dead: str | None = None
    calls: list[tuple[bool, bool]] = field(default_factory=list)
    generated: int = 0

    async def stats(self, detail: bool = False, timeout_s: float = 5.0,
                    live: bool = False) -> dict[str, Any]:  # fmt: skip
        self.calls.append((detail, live))
        await asyncio.sleep(0.01)
        self.generated += 100
        raw = {"num_waiting": 1, "num_decoding": 2, "device_pages_total": 64,
               "device_pages_free": 40, "device_pages_active": 20, "device_pages_cached": 4,
               "host_pages_total": 0, "num_steps": 9}  # fmt: skip
        out: dict[str, Any] = {"running": 2, "num_preemptions": 3, "scheduler": raw,
                               "prefix_cache_queried_tokens": 10, "prefix_cache_hit_tokens": 5}  # fmt: skip
        if live:
            out["live"] = {"prompt_tokens": 50, "generation_tokens": self.generated,
                           "num_steps": 9, "num_requests": 1,
                           "requests": [{"id": "r1", "state": "Decoding"}]}  # fmt: skip
        if detail:
            out["kernels"] = {"selections": [{"op": "o", "kernel": "k", "time": 1.0}]}
        return out


def _state(engine: _Engine) -> Any:
    llm = SimpleNamespace(engine=engine, max_model_len=512, shutting_down=False)
    args = SimpleNamespace(tensor_parallel_size=1, data_parallel_size=1, max_num_seqs=8)
    info = {"kv_capacity": {"page_size": 16, "device_pages": 64, "host_pages": 0},
            "version": "1.2.3", "device": "cpu", "dtype": "float32"}  # fmt: skip
    return SimpleNamespace(llm=llm, args=args, engine_info=info, model_name="m",
                           metrics=ServerMetrics("m"), started=0.0)  # fmt: skip


def test_hub_shares_one_engine_query_between_watchers_and_maps_the_stats() -> None:
    engine = _Engine()
    state = _state(engine)
    state.metrics.ttft.observe(0.2)
    hub = StatsHub(state)

    async def main() -> list[dict[str, Any]]:
        return await asyncio.gather(*(hub.snapshot() for _ in range(5)))

    snaps = asyncio.run(main())
    assert len(engine.calls) == 1 and engine.calls[0] == (True, True)  # kernels on the first
    assert all(s is snaps[0] for s in snaps)
    s = snaps[0]
    assert s["version"] == 1 and s["seq"] == 1 and s["engine"]["alive"]
    assert s["kv"]["device"] == {"total": 64, "free": 40, "active": 20, "cached": 4,
                                 "evictable": 0}  # fmt: skip
    assert s["scheduler"]["waiting"] == 1 and s["scheduler"]["preemptions"] == 3
    assert s["scheduler"]["prefix_cache_hit_rate"] == 0.5
    assert s["requests"] == [{"id": "r1", "state": "Decoding"}] and s["num_requests"] == 1
    assert s["kernels"] == [{"op": "o", "kernel": "k", "buckets": 1, "reason": "",
                             "device": ""}]  # fmt: skip
    assert s["server"]["model"] == "m" and s["server"]["layout"]["text"] == "TP1 DP1"
    assert s["throughput"]["generation_tokens"] == 100


def test_hub_derives_rates_and_latency_between_snapshots() -> None:
    engine = _Engine()
    state = _state(engine)
    hub = StatsHub(state)

    async def main() -> dict[str, Any]:
        await hub.snapshot()
        state.metrics.ttft.observe(0.25)
        state.metrics.itl.observe(0.01)
        state.metrics.itl.observe(0.03)
        await asyncio.sleep(0.15)
        return await hub.snapshot()

    s = asyncio.run(main())
    assert engine.calls[1] == (False, True)  # kernels are refreshed only every few seconds
    assert s["seq"] == 2
    assert s["throughput"]["generation_tokens_per_s"] > 0
    assert s["latency"]["ttft_ms"] == pytest.approx(250.0)
    assert s["latency"]["itl_ms"] == pytest.approx(20.0)
    assert s["kernels"][0]["kernel"] == "k"  # kept from the earlier detailed query


def test_hub_reports_a_dead_engine_without_asking_it() -> None:
    engine = _Engine(dead="the engine process exited with code 1")
    s = asyncio.run(StatsHub(_state(engine)).snapshot())
    assert engine.calls == []
    assert s["engine"] == {"alive": False, "error": engine.dead, "num_steps": 0}
    assert s["requests"] == [] and s["throughput"]["total_tokens_per_s"] is None


def test_hub_asks_for_kernels_again_while_none_were_chosen() -> None:
    class _NoKernelsYet(_Engine):
        async def stats(self, detail: bool = False, timeout_s: float = 5.0,
                        live: bool = False) -> dict[str, Any]:  # fmt: skip
            out = await super().stats(detail, timeout_s, live)
            if detail and len(self.calls) == 1:
                out["kernels"] = {"selections": []}  # no forward has run yet
            return out

    engine = _NoKernelsYet()
    hub = StatsHub(_state(engine))

    async def main() -> list[dict[str, Any]]:
        out = []
        for _ in range(3):
            out.append(await hub.snapshot())
            await asyncio.sleep(0.12)
        return out

    snaps = asyncio.run(main())
    assert [c[0] for c in engine.calls] == [True, True, False]
    assert snaps[0]["kernels"] == [] and snaps[1]["kernels"][0]["kernel"] == "k"
