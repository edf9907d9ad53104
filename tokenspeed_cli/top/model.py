"""Snapshot -> what the dashboard shows: plain, immutable view objects and the formatting rules.

Everything here is pure (no Textual, no I/O) so the mapping from the server's `/v1/stats`
document to the numbers on screen is unit-tested on its own. The widgets only draw these.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

SUPPORTED_VERSION = 1
HISTORY_POINTS = 120


class SnapshotError(ValueError):
    """A stats document this dashboard cannot read (wrong version or shape)."""


# ---- formatting ---------------------------------------------------------------------------
def fmt_ms(value: float | None) -> str:
    """Milliseconds, or a dash when not measured yet."""
    if value is None:
        return "–"
    return f"{value:.0f} ms" if value >= 10 else f"{value:.1f} ms"


def fmt_rate(value: float | None) -> str:
    """Tokens per second, or a dash when unknown."""
    if value is None:
        return "–"
    if value >= 10_000:
        return f"{value / 1000:.1f}k tok/s"
    return f"{value:.1f} tok/s" if value < 100 else f"{value:.0f} tok/s"


def fmt_duration(seconds: float) -> str:
    """Uptime as `1d 02:03:04`, `02:03:04` or `3m04s`."""
    s = max(0, int(seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}d {hours:02d}:{minutes:02d}:{s:02d}"
    if hours:
        return f"{hours:02d}:{minutes:02d}:{s:02d}"
    return f"{minutes}m{s:02d}s"


# ---- views --------------------------------------------------------------------------------
@dataclass(frozen=True)
class TierView:
    """One KV page tier (device or host): page counts that add up to `total`."""

    name: str
    total: int
    active: int
    cached: int
    free: int
    evictable: int = 0

    @property
    def present(self) -> bool:
        """False when the server has no such tier (host tier disabled)."""
        return self.total > 0

    def fractions(self) -> tuple[float, float, float]:
        """Active, cached and free shares of the tier (each in [0, 1])."""
        if self.total <= 0:
            return (0.0, 0.0, 0.0)
        return (self.active / self.total, self.cached / self.total, self.free / self.total)

    def legend(self) -> str:
        """The counts as the bar's caption."""
        if not self.present:
            return f"{self.name}: none (tier disabled)"
        used = self.active / self.total * 100
        return (
            f"{self.name}: {self.total} pages · active {self.active} ({used:.0f}%) · "
            f"cached {self.cached} · free {self.free}"
        )


@dataclass(frozen=True)
class RequestRow:
    """One live request as a table row."""

    id: str
    state: str
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    max_new_tokens: int
    ttft_ms: float | None
    tokens_per_s: float | None
    preemptions: int
    age_s: float

    def cells(self) -> tuple[str, ...]:
        """The row's cells, in `COLUMNS` order."""
        return (
            self.id,
            self.state,
            str(self.prompt_tokens),
            str(self.cached_tokens),
            f"{self.output_tokens}/{self.max_new_tokens}"
            if self.max_new_tokens
            else str(self.output_tokens),
            fmt_ms(self.ttft_ms),
            "–" if self.tokens_per_s is None else f"{self.tokens_per_s:.1f}",
            str(self.preemptions),
            f"{self.age_s:.1f}s",
        )


COLUMNS: tuple[str, ...] = (
    "id", "state", "prompt", "cached", "output", "TTFT", "tok/s", "preempt", "age",
)  # fmt: skip


@dataclass(frozen=True)
class SortKey:
    """A sort order of the requests table: a column, how to read it, and its direction."""

    column: str
    key: Callable[[RequestRow], Any]
    descending: bool

    def label(self) -> str:
        """The column with its direction arrow."""
        return f"{self.column} {'▼' if self.descending else '▲'}"


def _num(v: float | None) -> float:
    return float("-inf") if v is None else float(v)


SORT_KEYS: tuple[SortKey, ...] = (
    SortKey("age", lambda r: r.age_s, True),
    SortKey("id", lambda r: r.id, False),
    SortKey("state", lambda r: (r.state, r.id), False),
    SortKey("prompt", lambda r: r.prompt_tokens, True),
    SortKey("cached", lambda r: r.cached_tokens, True),
    SortKey("output", lambda r: r.output_tokens, True),
    SortKey("TTFT", lambda r: _num(r.ttft_ms), True),
    SortKey("tok/s", lambda r: _num(r.tokens_per_s), True),
    SortKey("preempt", lambda r: r.preemptions, True),
)


def arrange_rows(rows: Sequence[RequestRow], sort: SortKey, needle: str) -> list[RequestRow]:
    """Rows whose id contains `needle` (case-insensitive), sorted by `sort` (ties by id)."""
    needle = needle.strip().lower()
    kept = [r for r in rows if needle in r.id.lower()] if needle else list(rows)
    kept.sort(key=lambda r: r.id)
    kept.sort(key=sort.key, reverse=sort.descending)
    return kept


@dataclass(frozen=True)
class KernelRow:
    """One selected kernel: which op it serves, for how many shape buckets, and why."""

    op: str
    kernel: str
    buckets: int
    reason: str

    def cells(self) -> tuple[str, ...]:
        return (self.op, self.kernel, str(self.buckets), self.reason)


KERNEL_COLUMNS: tuple[str, ...] = ("op", "kernel", "shapes", "why")


@dataclass(frozen=True)
class DashboardView:
    """Everything one snapshot puts on screen."""

    seq: int
    model: str
    version: str
    layout: str
    device: str
    uptime_s: float
    engine_alive: bool
    engine_error: str | None
    page_size: int
    device_tier: TierView
    host_tier: TierView
    waiting: int
    prefilling: int
    decoding: int
    retracted: int
    preemptions: int
    prefix_hit_rate: float | None
    prompt_tps: float | None
    generation_tps: float | None
    total_tps: float | None
    ttft_ms: float | None
    itl_ms: float | None
    requests: tuple[RequestRow, ...]
    num_requests: int
    kernels: tuple[KernelRow, ...]

    def scheduler_line(self) -> str:
        """Queue and cache counters in one line."""
        hit = "–" if self.prefix_hit_rate is None else f"{self.prefix_hit_rate * 100:.1f}%"
        return (
            f"waiting {self.waiting} · prefilling {self.prefilling} · decoding {self.decoding}"
            f" · retracted {self.retracted} · preemptions {self.preemptions}"
            f" · prefix-cache hit {hit}"
        )

    def throughput_line(self) -> str:
        return (
            f"throughput {fmt_rate(self.total_tps)}  (prompt {fmt_rate(self.prompt_tps)}, "
            f"generation {fmt_rate(self.generation_tps)})"
        )

    def ttft_line(self) -> str:
        return f"TTFT {fmt_ms(self.ttft_ms)}  (mean of first tokens in the last few seconds)"

    def itl_line(self) -> str:
        return f"ITL {fmt_ms(self.itl_ms)}  (mean gap between streamed chunks, same window)"


def _get(d: Any, key: str, kind: type, default: Any = None) -> Any:
    """`d[key]` converted to `kind`; `default` when absent or null."""
    if not isinstance(d, dict):
        raise SnapshotError(f"expected an object holding {key!r}")
    v = d.get(key)
    if v is None:
        return default
    try:
        return kind(v)
    except (TypeError, ValueError):
        raise SnapshotError(f"{key!r} is not a {kind.__name__}: {v!r}") from None


def _tier(name: str, d: Any) -> TierView:
    return TierView(
        name=name,
        total=_get(d, "total", int, 0),
        active=_get(d, "active", int, 0),
        cached=_get(d, "cached", int, 0),
        free=_get(d, "free", int, 0),
        evictable=_get(d, "evictable", int, 0),
    )


def _row(d: Any) -> RequestRow:
    return RequestRow(
        id=_get(d, "id", str, "?"),
        state=_get(d, "state", str, "?"),
        prompt_tokens=_get(d, "prompt_tokens", int, 0),
        cached_tokens=_get(d, "cached_tokens", int, 0),
        output_tokens=_get(d, "output_tokens", int, 0),
        max_new_tokens=_get(d, "max_new_tokens", int, 0),
        ttft_ms=_get(d, "ttft_ms", float),
        tokens_per_s=_get(d, "tokens_per_s", float),
        preemptions=_get(d, "preemptions", int, 0),
        age_s=_get(d, "age_s", float, 0.0),
    )


def view_from_snapshot(snap: Any) -> DashboardView:
    """Map one `/v1/stats` document to the view; `SnapshotError` if it is not one."""
    if not isinstance(snap, dict) or "version" not in snap:
        raise SnapshotError("not a TokenSpeed stats snapshot")
    if snap["version"] != SUPPORTED_VERSION:
        raise SnapshotError(
            f"stats schema version {snap['version']!r}; this dashboard reads {SUPPORTED_VERSION}"
        )
    server, engine = snap.get("server") or {}, snap.get("engine") or {}
    sched, kv = snap.get("scheduler") or {}, snap.get("kv") or {}
    tput, lat = snap.get("throughput") or {}, snap.get("latency") or {}
    layout = server.get("layout") or {}
    return DashboardView(
        seq=_get(snap, "seq", int, 0),
        model=_get(server, "model", str, "?"),
        version=_get(server, "version", str, "?"),
        layout=_get(layout, "text", str, "?") if isinstance(layout, dict) else "?",
        device=f"{server.get('device') or '?'} {server.get('dtype') or ''}".strip(),
        uptime_s=_get(server, "uptime_s", float, 0.0),
        engine_alive=bool(engine.get("alive", True)),
        engine_error=_get(engine, "error", str),
        page_size=_get(kv, "page_size", int, 0),
        device_tier=_tier("device", kv.get("device") or {}),
        host_tier=_tier("host", kv.get("host") or {}),
        waiting=_get(sched, "waiting", int, 0),
        prefilling=_get(sched, "prefilling", int, 0),
        decoding=_get(sched, "decoding", int, 0),
        retracted=_get(sched, "retracted", int, 0),
        preemptions=_get(sched, "preemptions", int, 0),
        prefix_hit_rate=_get(sched, "prefix_cache_hit_rate", float),
        prompt_tps=_get(tput, "prompt_tokens_per_s", float),
        generation_tps=_get(tput, "generation_tokens_per_s", float),
        total_tps=_get(tput, "total_tokens_per_s", float),
        ttft_ms=_get(lat, "ttft_ms", float),
        itl_ms=_get(lat, "itl_ms", float),
        requests=tuple(_row(r) for r in snap.get("requests") or []),
        num_requests=_get(snap, "num_requests", int, 0),
        kernels=tuple(
            KernelRow(
                op=_get(k, "op", str, "?"),
                kernel=_get(k, "kernel", str, "?"),
                buckets=_get(k, "buckets", int, 0),
                reason=_get(k, "reason", str, ""),
            )
            for k in snap.get("kernels") or []
        ),
    )


# ---- history and connection ---------------------------------------------------------------
class History:
    """The last `HISTORY_POINTS` values of each sparkline series (unknown values drawn as 0)."""

    SERIES = ("throughput", "ttft", "itl")

    def __init__(self, points: int = HISTORY_POINTS) -> None:
        self.series: dict[str, deque[float]] = {s: deque(maxlen=points) for s in self.SERIES}
        self.last_seq: int | None = None

    def push(self, view: DashboardView) -> bool:
        """Append one snapshot's values; a repeated `seq` (shared snapshot) is skipped."""
        if view.seq == self.last_seq:
            return False
        self.last_seq = view.seq
        self.series["throughput"].append(view.total_tps or 0.0)
        self.series["ttft"].append(view.ttft_ms or 0.0)
        self.series["itl"].append(view.itl_ms or 0.0)
        return True

    def values(self, name: str) -> list[float]:
        return list(self.series[name])


class Connection(Enum):
    """Where the dashboard stands with the server."""

    CONNECTING = "connecting"
    CONNECTED = "connected"
    DISCONNECTED = "disconnected"


def connection_text(state: Connection, retry_in: float | None = None, reason: str = "") -> str:
    """The header's connection field."""
    if state is Connection.DISCONNECTED:
        when = f" in {retry_in:.1f}s" if retry_in is not None else ""
        return f"disconnected — retrying{when}" + (f" ({reason})" if reason else "")
    return state.value


def header_text(view: DashboardView | None, url: str, connection: str, paused: bool) -> str:
    """The header line: model, layout, uptime, URL, connection state (and PAUSED)."""
    parts = []
    if view is not None:
        parts += [
            f"{view.model} (tokenspeed {view.version})",
            view.layout,
            view.device,
            f"up {fmt_duration(view.uptime_s)}",
        ]
        if not view.engine_alive:
            parts.append(f"engine down: {view.engine_error or 'unknown'}")
    parts += [url, connection]
    if paused:
        parts.append("PAUSED")
    return " │ ".join(parts)


class Backoff:
    """Reconnect delays: `first`, doubling up to `cap`; `reset()` after a success."""

    def __init__(self, first: float = 0.5, cap: float = 5.0) -> None:
        self.first, self.cap = first, cap
        self._next = first

    def next(self) -> float:
        delay = self._next
        self._next = min(self.cap, self._next * 2)
        return delay

    def reset(self) -> None:
        self._next = self.first
