"""Engine-side request state and its per-request statistics (host timestamps only)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tokenspeed.runtime.grammar.backend import RequestGrammar
from tokenspeed.runtime.sampling import SamplingParams


@dataclass
class RequestStats:
    """The per-request stats line: token counts, cache hits, latencies (ms), preemptions, and
    speculative decoding's ``acc_len`` (output tokens per decode step, 1 without drafts) and
    ``acc_rate`` (drafts accepted / drafted)."""

    prompt_tokens: int = 0
    cache_tokens: int = 0
    output_tokens: int = 0
    cache_hit_rate: float = 0.0
    queue_ms: float = 0.0
    prefill_ms: float = 0.0
    ttft_ms: float = 0.0
    total_ms: float = 0.0
    preempt_ms: float = 0.0
    preempt_count: int = 0
    decode_tps: float = 0.0
    acc_len: float = 1.0
    acc_rate: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def line(self) -> str:
        """One log line, ``key=value`` pairs in a fixed order."""
        parts = []
        for key, value in self.__dict__.items():
            parts.append(f"{key}={value:.2f}" if isinstance(value, float) else f"{key}={value}")
        return " ".join(parts)


@dataclass
class Request:
    """One request as the engine tracks it between submit and finish."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    stop_ids: frozenset[int]
    max_new_tokens: int
    arrival: float = field(default_factory=time.perf_counter)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] = field(default_factory=list)
    finish_reason: str | None = None
    slot: int | None = None
    first_scheduled: float | None = None
    first_token: float | None = None
    finished_at: float | None = None
    stats: RequestStats | None = None
    grammar: RequestGrammar | None = None  # structured outputs: the output's matcher
    spec_drafted: int = 0  # speculative decoding: drafts verified for it, and kept
    spec_accepted: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def compute_stats(self, scheduler_stats: Any) -> RequestStats:
        """Fill the stats from host timestamps and what the scheduler knows (cache, preemption)."""
        end = self.finished_at or time.perf_counter()
        started = self.first_scheduled or end
        first = self.first_token or end
        # the scheduler's RequestStats; None when it no longer knows the request
        cached = int(scheduler_stats.cached_tokens) if scheduler_stats is not None else 0
        n_out = len(self.output_ids)
        decode_s = end - first
        self.stats = RequestStats(
            prompt_tokens=len(self.prompt_ids),
            cache_tokens=cached,
            output_tokens=n_out,
            cache_hit_rate=cached / len(self.prompt_ids) if self.prompt_ids else 0.0,
            queue_ms=(started - self.arrival) * 1e3,
            prefill_ms=(first - started) * 1e3,
            ttft_ms=(first - self.arrival) * 1e3,
            total_ms=(end - self.arrival) * 1e3,
            preempt_ms=float(scheduler_stats.preempt_ms) if scheduler_stats is not None else 0.0,
            preempt_count=int(scheduler_stats.preempt_count) if scheduler_stats is not None else 0,
            decode_tps=(n_out - 1) / decode_s if n_out > 1 and decode_s > 0 else 0.0,
            # each step after the first token gave one token plus the drafts it accepted
            acc_len=(n_out - 1) / (n_out - 1 - self.spec_accepted) if n_out > 1 else 1.0,
            acc_rate=self.spec_accepted / self.spec_drafted if self.spec_drafted else 0.0,
        )
        return self.stats


@dataclass(slots=True)
class RequestUpdate:
    """What one step produced for one request: new tokens, and the end if it finished.

    ``cached_tokens`` (prefix-cache hit, in tokens) is set on the request's first token only
    (and the stats carry it at the end); ``None`` on every other update. One of these is built
    per sampled request per step, hence ``slots`` (about half the construction cost).
    """

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[dict[int, float]] | None = None
    finished: bool = False
    finish_reason: str | None = None
    stats: RequestStats | None = None
    cached_tokens: int | None = None
    error: str | None = None  # the request failed before running (a grammar that did not compile)


@dataclass(slots=True)
class StepUpdates:
    """What one step produced, each request at most once.

    ``rids`` and ``tokens`` are the requests that gained exactly one token and have nothing
    else to report (all of a decode step but first tokens, logprobs and finishes), kept as two
    columns so the per-step path builds no object per decoding request; ``block_rids`` and
    ``blocks`` are the same for a speculative step's verified blocks (one token list each);
    ``updates`` holds every other request's ``RequestUpdate``. Iterating yields
    ``RequestUpdate``s for all of them (the offline API and tests read it that way).
    """

    rids: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    updates: list[RequestUpdate] = field(default_factory=list)
    block_rids: list[str] = field(default_factory=list)
    blocks: list[list[int]] = field(default_factory=list)

    def __iter__(self) -> Iterator[RequestUpdate]:
        yield from self.updates
        for rid, token in zip(self.rids, self.tokens, strict=True):
            yield RequestUpdate(rid, [token])
        for rid, block in zip(self.block_rids, self.blocks, strict=True):
            yield RequestUpdate(rid, block)

    def __len__(self) -> int:
        return len(self.rids) + len(self.block_rids) + len(self.updates)

    def __bool__(self) -> bool:
        return bool(self.rids) or bool(self.block_rids) or bool(self.updates)

    def column_tokens(self) -> int:
        """How many tokens the columns carry (none of them a request's first)."""
        return len(self.tokens) + sum(map(len, self.blocks))
