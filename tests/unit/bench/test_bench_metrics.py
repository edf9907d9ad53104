"""Metric math against hand-computed values (vLLM's definitions)."""

from __future__ import annotations

import pytest

from tokenspeed_cli.bench.client import RequestResult
from tokenspeed_cli.bench.errors import BenchError
from tokenspeed_cli.bench.metrics import (
    compute_metrics,
    parse_goodput,
    per_request_arrays,
    summarize_ms,
    tpot_of,
)


def _results() -> list[RequestResult]:
    ok = dict(success=True)
    return [
        # TPOT (0.5 - 0.1) / 4 = 100 ms
        RequestResult(
            **ok,
            prompt_len=10,
            output_len=5,
            cached_tokens=5,
            ttft=0.1,
            itl=[0.1, 0.1, 0.1, 0.1],
            latency=0.5,
        ),  # fmt: skip
        # TPOT (1.3 - 0.3) / 2 = 500 ms
        RequestResult(
            **ok,
            prompt_len=20,
            output_len=3,
            cached_tokens=10,
            ttft=0.3,
            itl=[0.4, 0.6],
            latency=1.3,
        ),  # fmt: skip
        # one output token: no TPOT; no cache report
        RequestResult(**ok, prompt_len=30, output_len=1, ttft=0.2, latency=0.2),
        RequestResult(prompt_len=40, error="HTTP 500: boom"),
    ]


def test_tpot_definition() -> None:
    a, b, c, _ = _results()
    assert tpot_of(a) == pytest.approx(0.1)
    assert tpot_of(b) == pytest.approx(0.5)
    assert tpot_of(c) is None


def test_summary_percentiles_use_linear_interpolation() -> None:
    s = summarize_ms("ttft", [0.1, 0.3, 0.2])
    assert s["mean_ttft_ms"] == pytest.approx(200.0)
    assert s["median_ttft_ms"] == pytest.approx(200.0)
    assert s["std_ttft_ms"] == pytest.approx((20000 / 3) ** 0.5)
    assert s["p90_ttft_ms"] == pytest.approx(280.0)
    assert s["p99_ttft_ms"] == pytest.approx(298.0)
    empty = summarize_ms("itl", [])
    assert set(empty) == {"mean_itl_ms", "median_itl_ms", "std_itl_ms", "p90_itl_ms", "p99_itl_ms"}
    assert all(v == 0.0 for v in empty.values())


def test_compute_metrics_by_hand() -> None:
    m = compute_metrics(_results(), duration_s=2.0, max_concurrent_requests=3)
    assert m["completed"] == 3 and m["failed"] == 1
    assert m["total_input_tokens"] == 60  # completed only
    assert m["total_output_tokens"] == 9
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["output_throughput"] == pytest.approx(4.5)
    assert m["total_token_throughput"] == pytest.approx(34.5)
    assert m["request_goodput"] is None  # no SLOs given
    assert m["prefix_cache_hit_rate"] == pytest.approx(15 / 30)  # requests that reported
    assert m["total_cached_tokens"] == 15
    assert m["mean_ttft_ms"] == pytest.approx(200.0)
    assert m["mean_tpot_ms"] == pytest.approx(300.0)
    assert m["median_tpot_ms"] == pytest.approx(300.0)
    assert m["p90_tpot_ms"] == pytest.approx(460.0)
    assert m["p99_tpot_ms"] == pytest.approx(496.0)
    assert m["mean_itl_ms"] == pytest.approx(1400 / 6)  # all gaps of all requests
    assert m["median_itl_ms"] == pytest.approx(100.0)
    assert m["mean_e2el_ms"] == pytest.approx(2000 / 3)
    assert m["p99_e2el_ms"] == pytest.approx(1300 - 0.02 * 800)
    assert m["max_concurrent_requests"] == 3


def test_goodput_counts_requests_meeting_every_slo() -> None:
    results = _results()
    # r1 (ttft 100, tpot 100) meets; r2 ttft 300 misses; r3 ttft 200, tpot counts as 0
    m = compute_metrics(results, 2.0, {"ttft": 250.0, "tpot": 200.0})
    assert m["request_goodput"] == pytest.approx(1.0)
    m = compute_metrics(results, 2.0, {"e2el": 400.0})
    assert m["request_goodput"] == pytest.approx(0.5)
    m = compute_metrics(results, 2.0, {"tpot": 99.0})
    assert m["request_goodput"] == pytest.approx(0.5)  # only the one-token request


def test_no_cache_reports_means_no_hit_rate() -> None:
    r = RequestResult(success=True, prompt_len=5, output_len=2, ttft=0.1, latency=0.2)
    m = compute_metrics([r], 1.0)
    assert m["prefix_cache_hit_rate"] is None and m["total_cached_tokens"] is None


def test_per_request_arrays_include_failures() -> None:
    arrays = per_request_arrays(_results())
    assert arrays["input_lens"] == [10, 20, 30, 40]
    assert arrays["output_lens"] == [5, 3, 1, 0]
    assert arrays["errors"] == ["", "", "", "HTTP 500: boom"]
    assert arrays["itls"][1] == [0.4, 0.6]
    assert arrays["cached_tokens"] == [5, 10, None, None]


def test_parse_goodput() -> None:
    assert parse_goodput(None) == {}
    assert parse_goodput(["ttft:200", "tpot:50"]) == {"ttft": 200.0, "tpot": 50.0}
    assert parse_goodput(["ttft:200 e2el:1e3"]) == {"ttft": 200.0, "e2el": 1000.0}
    assert parse_goodput(["ttft:1,tpot:2.5"]) == {"ttft": 1.0, "tpot": 2.5}


@pytest.mark.parametrize("spec", ["ttft=200", "itl:5", "ttft:fast", "tpot:0", "ttft:-1", ":5"])
def test_parse_goodput_rejects(spec: str) -> None:
    with pytest.raises(BenchError, match="bad --goodput"):
        parse_goodput([spec])
