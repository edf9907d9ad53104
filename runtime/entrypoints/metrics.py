"""Prometheus metrics with vLLM's names under `tokenspeed:`,.

Latency histograms and token counters are observed in the server process as outputs arrive
(host timestamps only). Scheduler-owned numbers (running/waiting requests, KV usage, prefix
cache queries/hits, preemptions) come from the engine's stats snapshot, fetched when
`/metrics` is scraped, and are exposed through a collector so they are never stale copies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

PREFIX = "tokenspeed:"

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)  # fmt: skip
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
_LONG_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0)  # fmt: skip


class EngineStatsCollector(Collector):
    """Exposes the latest engine snapshot as gauges and (engine-cumulative) counters."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.snapshot: dict[str, Any] = {}

    def collect(self) -> Iterator[Metric]:
        s, labels = self.snapshot, [self.model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(PREFIX + name, doc, labels=["model_name"])
            g.add_metric(labels, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(PREFIX + name, doc, labels=["model_name"])
            c.add_metric(labels, value)
            return c

        yield gauge("num_requests_running", "Requests in the running batch.", s.get("running", 0))
        yield gauge(
            "num_requests_waiting", "Requests waiting to be scheduled.", s.get("waiting", 0)
        )
        yield gauge(
            "kv_cache_usage_perc",
            "Fraction of device KV pages in use by requests (1 = full).",
            s.get("kv_cache_usage", 0.0),
        )
        yield counter(
            "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
            s.get("prefix_cache_queried_tokens", 0),
        )  # fmt: skip
        yield counter(
            "prefix_cache_hits", "Prompt tokens found in the prefix cache.",
            s.get("prefix_cache_hit_tokens", 0),
        )  # fmt: skip
        yield counter("num_preemptions", "Requests retracted under page pressure.",
                      s.get("num_preemptions", 0))  # fmt: skip
        yield counter("spec_decode_num_draft_tokens", "Drafted tokens verified (speculative "
                      "decoding).", s.get("spec_draft_tokens", 0))  # fmt: skip
        yield counter("spec_decode_num_accepted_tokens", "Drafted tokens the model accepted.",
                      s.get("spec_accepted_tokens", 0))  # fmt: skip
        yield counter("spec_decode_num_drafts", "Drafted blocks verified (one request's drafts "
                      "in one step).", s.get("spec_drafts", 0))  # fmt: skip


class ServerMetrics:
    """Every metric of one server, in a private registry (so tests can build several)."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.engine = EngineStatsCollector(model_name)
        self.registry.register(self.engine)
        lab = ["model_name"]

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(PREFIX + name, doc, lab, registry=self.registry, buckets=buckets)

        def count(name: str, doc: str) -> Any:
            return Counter(PREFIX + name, doc, lab, registry=self.registry)

        m = model_name
        self.ttft = hist(
            "time_to_first_token_seconds", "Time to first token.", _TTFT_BUCKETS
        ).labels(m)
        self.itl = hist(
            "inter_token_latency_seconds", "Gap between output steps.", _ITL_BUCKETS
        ).labels(m)
        self.e2e = hist("e2e_request_latency_seconds", "Request latency.", _LONG_BUCKETS).labels(m)
        self.queue = hist("request_queue_time_seconds", "Time waiting before the first schedule.",
                          _LONG_BUCKETS).labels(m)  # fmt: skip
        self.prefill = hist("request_prefill_time_seconds", "Time spent in prefill.",
                            _LONG_BUCKETS).labels(m)  # fmt: skip
        self.decode = hist("request_decode_time_seconds", "Time spent decoding.",
                           _LONG_BUCKETS).labels(m)  # fmt: skip
        self.prompt_tokens = count("prompt_tokens", "Prompt tokens of finished requests.").labels(m)
        self.generation_tokens = count("generation_tokens", "Generated tokens.").labels(m)
        self._success = Counter(PREFIX + "request_success", "Finished requests by reason.",
                                ["model_name", "finished_reason"], registry=self.registry)  # fmt: skip
        self._model = m

    def observe_finished(
        self, finish_reason: str, prompt_tokens: int, output_tokens: int, e2e_s: float,
        stats: dict[str, Any] | None,
    ) -> None:  # fmt: skip
        """Count one finished sequence and record its engine-side timings."""
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(output_tokens)
        self._success.labels(self._model, finish_reason).inc()
        self.e2e.observe(e2e_s)
        if stats:
            for hist, key in ((self.queue, "queue_ms"), (self.prefill, "prefill_ms")):
                if stats.get(key) is not None:
                    hist.observe(stats[key] / 1000.0)
            if stats.get("total_ms") is not None and stats.get("ttft_ms") is not None:
                self.decode.observe(max(0.0, stats["total_ms"] - stats["ttft_ms"]) / 1000.0)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
