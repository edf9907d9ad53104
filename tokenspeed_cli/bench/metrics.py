"""Benchmark metrics with `vllm bench serve`'s definitions and JSON key names.

Per request: TTFT, E2EL, ITL (every gap between streamed text chunks) and TPOT =
(E2EL - TTFT) / (output tokens - 1), defined only when more than one token came back. Each
latency is summarised as mean, median, std, p90 and p99 in milliseconds (ITL over all gaps of
all requests). Throughputs divide by the benchmark's wall-clock duration; goodput counts the
requests that meet every given SLO. Totals count completed requests only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tokenspeed_cli.bench.client import RequestResult
from tokenspeed_cli.bench.errors import BenchError

SLO_KEYS = ("ttft", "tpot", "e2el")
LATENCIES = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (90, 99)


def parse_goodput(specs: Sequence[str] | None) -> dict[str, float]:
    """``["ttft:200", "tpot:50"]`` (or one comma/space-separated string) -> SLOs in ms."""
    slos: dict[str, float] = {}
    for spec in specs or []:
        for item in spec.replace(",", " ").split():
            key, sep, value = item.partition(":")
            if not sep or key not in SLO_KEYS:
                raise BenchError(
                    f"bad --goodput {item!r}: expected KEY:MS with KEY one of {', '.join(SLO_KEYS)}"
                )
            try:
                ms = float(value)
            except ValueError:
                raise BenchError(f"bad --goodput {item!r}: {value!r} is not a number") from None
            if not ms > 0:
                raise BenchError(f"bad --goodput {item!r}: the limit must be positive")
            slos[key] = ms
    return slos


def tpot_of(r: RequestResult) -> float | None:
    """Seconds per output token after the first; None with fewer than two output tokens."""
    if r.output_len <= 1:
        return None
    return (r.latency - r.ttft) / (r.output_len - 1)


def summarize_ms(name: str, values_s: Sequence[float]) -> dict[str, float]:
    """``mean_<name>_ms``, median, std and percentiles of values given in seconds (0 if none)."""
    if not values_s:
        stats = {"mean": 0.0, "median": 0.0, "std": 0.0, **{f"p{p}": 0.0 for p in PERCENTILES}}
    else:
        arr = np.asarray(values_s, dtype=np.float64) * 1000.0
        stats = {
            "mean": float(arr.mean()),
            "median": float(np.median(arr)),
            "std": float(arr.std()),
        }
        stats.update({f"p{p}": float(np.percentile(arr, p)) for p in PERCENTILES})
    return {f"{k}_{name}_ms": v for k, v in stats.items()}


def meets_slos(r: RequestResult, slos: dict[str, float]) -> bool:
    """Whether a completed request is within every SLO (a one-token request's TPOT is 0)."""
    values_ms = {
        "ttft": r.ttft * 1000,
        "tpot": (tpot_of(r) or 0.0) * 1000,
        "e2el": r.latency * 1000,
    }
    return all(values_ms[k] <= limit for k, limit in slos.items())


def compute_metrics(
    results: Sequence[RequestResult],
    duration_s: float,
    slos: dict[str, float] | None = None,
    max_concurrent_requests: int | None = None,
) -> dict[str, Any]:
    """The summary: counts, totals, throughputs, goodput, cache hit rate and latency stats."""
    done = [r for r in results if r.success]
    total_in = sum(r.prompt_len for r in done)
    total_out = sum(r.output_len for r in done)
    dur = max(duration_s, 1e-9)
    reported = [r for r in done if r.cached_tokens is not None]
    reported_prompt = sum(r.prompt_len for r in reported)
    cached = sum(r.cached_tokens or 0 for r in reported)
    metrics: dict[str, Any] = {
        "duration": duration_s,
        "completed": len(done),
        "failed": len(results) - len(done),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(done) / dur,
        "request_goodput": (sum(meets_slos(r, slos) for r in done) / dur) if slos else None,
        "output_throughput": total_out / dur,
        "total_token_throughput": (total_in + total_out) / dur,
        "total_cached_tokens": cached if reported else None,
        "prefix_cache_hit_rate": (cached / reported_prompt) if reported_prompt else None,
        "max_concurrent_requests": max_concurrent_requests,
    }
    tpots = [t for t in (tpot_of(r) for r in done) if t is not None]
    metrics |= summarize_ms("ttft", [r.ttft for r in done])
    metrics |= summarize_ms("tpot", tpots)
    metrics |= summarize_ms("itl", [gap for r in done for gap in r.itl])
    metrics |= summarize_ms("e2el", [r.latency for r in done])
    return metrics


def per_request_arrays(results: Sequence[RequestResult]) -> dict[str, list[Any]]:
    """Per-request lists for the saved file (seconds; failed requests included, as vLLM does)."""
    return {
        "input_lens": [r.prompt_len for r in results],
        "output_lens": [r.output_len for r in results],
        "cached_tokens": [r.cached_tokens for r in results],
        "ttfts": [r.ttft for r in results],
        "itls": [r.itl for r in results],
        "e2els": [r.latency for r in results],
        "generated_texts": [r.generated_text for r in results],
        "errors": [r.error for r in results],
    }
