"""Snapshot -> view mapping of `tokenspeed top`: every number on screen comes from the document."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from top_snapshots import snapshot  # noqa: E402

from tokenspeed_cli.top.model import (  # noqa: E402
    SORT_KEYS,
    Backoff,
    Connection,
    History,
    SnapshotError,
    arrange_rows,
    connection_text,
    fmt_duration,
    fmt_ms,
    fmt_rate,
    header_text,
    view_from_snapshot,
)


def test_view_carries_every_number_of_the_snapshot() -> None:
    v = view_from_snapshot(snapshot())
    assert (v.seq, v.model, v.version, v.layout) == (7, "tiny-test", "9.9.9", "TP4 DP2 EP")
    assert v.device == "cuda:0 bfloat16"
    assert v.uptime_s == pytest.approx(3723.4)
    d, h = v.device_tier, v.host_tier
    assert (d.total, d.active, d.cached, d.free, d.evictable) == (200, 50, 30, 120, 30)
    assert (h.total, h.active, h.cached, h.free) == (50, 0, 10, 40)
    assert d.fractions() == pytest.approx((0.25, 0.15, 0.6))
    assert (v.waiting, v.prefilling, v.decoding, v.retracted, v.preemptions) == (2, 1, 3, 1, 5)
    assert v.prefix_hit_rate == 0.25
    assert (v.prompt_tps, v.generation_tps, v.total_tps) == (1500.0, 250.5, 1750.5)
    assert (v.ttft_ms, v.itl_ms) == (123.4, 7.25)
    assert [r.id for r in v.requests] == ["chatcmpl-aaa-0-0", "cmpl-bbb-0-0", "cmpl-ccc-0-1"]
    assert v.requests[1].ttft_ms is None and v.requests[1].tokens_per_s is None
    assert [(k.op, k.kernel, k.buckets) for k in v.kernels] == [
        ("attention.decode", "triton_decode", 3),
        ("norm.rms", "torch_rms_norm", 1),
    ]


def test_lines_and_cells_show_the_numbers() -> None:
    v = view_from_snapshot(snapshot())
    assert v.device_tier.legend() == ("device: 200 pages · active 50 (25%) · cached 30 · free 120")
    assert "prefix-cache hit 25.0%" in v.scheduler_line()
    assert "waiting 2" in v.scheduler_line() and "preemptions 5" in v.scheduler_line()
    assert "throughput 1750 tok/s" in v.throughput_line() and "250 tok/s" in v.throughput_line()
    assert "123 ms" in v.ttft_line() and "7.2 ms" in v.itl_line()
    assert v.requests[0].cells() == (
        "chatcmpl-aaa-0-0", "Decoding", "100", "64", "10/50", "80 ms", "40.0", "0", "3.0s",
    )  # fmt: skip
    assert v.requests[1].cells()[5:7] == ("–", "–")


def test_missing_host_tier_and_unknown_rates_are_shown_as_such() -> None:
    snap = snapshot(
        throughput={"prompt_tokens_per_s": None, "generation_tokens_per_s": None},
        latency={"ttft_ms": None, "itl_ms": None},
    )
    snap["kv"]["host"] = {"total": 0, "free": 0, "active": 0, "cached": 0, "evictable": 0}
    v = view_from_snapshot(snap)
    assert not v.host_tier.present
    assert v.host_tier.fractions() == (0.0, 0.0, 0.0)
    assert "disabled" in v.host_tier.legend()
    assert v.total_tps is None and "–" in v.throughput_line()
    assert "TTFT –" in v.ttft_line()


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"seq": 1},
        snapshot(version=2),
        snapshot(seq="many"),
        snapshot(requests=[{"id": "x", "prompt_tokens": "lots"}]),
        snapshot(kv={"device": [1, 2]}),
    ],
    ids=["not-object", "no-version", "future-version", "bad-seq", "bad-row", "bad-tier"],
)
def test_malformed_snapshots_raise_snapshot_error(bad: object) -> None:
    with pytest.raises(SnapshotError):
        view_from_snapshot(bad)


def test_sort_keys_order_rows_and_filter_matches_id_substrings() -> None:
    rows = view_from_snapshot(snapshot()).requests
    by = {k.column: k for k in SORT_KEYS}
    assert [r.id[-5:] for r in arrange_rows(rows, by["age"], "")] == ["b-0-0", "a-0-0", "c-0-1"]
    assert [r.id[-5:] for r in arrange_rows(rows, by["output"], "")][0] == "c-0-1"
    # Unknown TTFT sorts last when sorting by TTFT, largest first.
    assert [r.ttft_ms for r in arrange_rows(rows, by["TTFT"], "")] == [80.0, 20.0, None]
    assert [r.id for r in arrange_rows(rows, by["id"], "")] == sorted(r.id for r in rows)
    assert [r.id for r in arrange_rows(rows, by["age"], "CMPL-B")] == ["cmpl-bbb-0-0"]
    assert len(arrange_rows(rows, by["age"], "cmpl")) == 3
    assert arrange_rows(rows, by["age"], "zzz") == []
    assert len({k.column for k in SORT_KEYS}) == len(SORT_KEYS)


def test_history_skips_a_repeated_snapshot_and_draws_unknown_as_zero() -> None:
    h = History(points=3)
    assert h.push(view_from_snapshot(snapshot(seq=1)))
    assert not h.push(view_from_snapshot(snapshot(seq=1)))
    assert h.push(view_from_snapshot(snapshot(seq=2, latency={"ttft_ms": None})))
    assert h.values("throughput") == [1750.5, 1750.5]
    assert h.values("ttft") == [123.4, 0.0]
    for seq in range(3, 7):
        h.push(view_from_snapshot(snapshot(seq=seq)))
    assert len(h.values("itl")) == 3


def test_header_says_model_layout_uptime_url_and_connection() -> None:
    v = view_from_snapshot(snapshot())
    text = header_text(v, "http://h:1", connection_text(Connection.CONNECTED), paused=False)
    for part in ("tiny-test", "TP4 DP2 EP", "up 01:02:03", "http://h:1", "connected"):
        assert part in text
    assert "PAUSED" not in text
    gone = connection_text(Connection.DISCONNECTED, 2.0, "cannot connect")
    assert gone == "disconnected — retrying in 2.0s (cannot connect)"
    assert "PAUSED" in header_text(v, "u", gone, paused=True)
    down = view_from_snapshot(snapshot(engine={"alive": False, "error": "boom"}))
    assert "engine down: boom" in header_text(down, "u", "connected", paused=False)
    assert header_text(None, "u", "connecting", paused=False) == "u │ connecting"


def test_formatting() -> None:
    assert fmt_duration(59) == "0m59s" and fmt_duration(3723) == "01:02:03"
    assert fmt_duration(90061) == "1d 01:01:01"
    assert fmt_ms(None) == "–" and fmt_ms(3.25) == "3.2 ms" and fmt_ms(250.4) == "250 ms"
    assert fmt_rate(None) == "–" and fmt_rate(12.34) == "12.3 tok/s"
    assert fmt_rate(12345) == "12.3k tok/s"


def test_backoff_doubles_to_a_cap_and_resets() -> None:
    b = Backoff(first=0.5, cap=3.0)
    assert [b.next() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    b.reset()
    assert b.next() == 0.5
