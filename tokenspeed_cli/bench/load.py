"""Load shaping: when requests start (Poisson/gamma arrivals) and how many run at once.

Arrival times follow vLLM's `bench serve`: gaps drawn from a gamma distribution with shape
``burstiness`` and mean ``1 / rate`` (shape 1 is a Poisson process; below 1 burstier, above
1 more regular); an infinite rate sends everything at time zero. A `Limiter` caps requests in
flight independently of arrivals: a request that arrives while the cap is reached waits.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")
R = TypeVar("R")


def arrival_offsets(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Start times (s, from the benchmark's start) of ``n`` arrivals; the first is at 0."""
    if n <= 0:
        return []
    if rate <= 0 or burstiness <= 0:
        raise ValueError("rate and burstiness must be positive")
    if math.isinf(rate):
        return [0.0] * n
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return [0.0, *np.cumsum(gaps).tolist()]


class Limiter:
    """An async concurrency cap (None = no cap) that also records the peak in flight."""

    def __init__(self, max_concurrency: int | None) -> None:
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        self._sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        self.in_flight = 0
        self.peak = 0

    async def __aenter__(self) -> Limiter:
        if self._sem is not None:
            await self._sem.acquire()
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.in_flight -= 1
        if self._sem is not None:
            self._sem.release()


async def _wait_until(start: float, offset: float) -> None:
    delay = start + offset - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


async def run_at_offsets(
    jobs: Sequence[T],
    offsets: Sequence[float],
    job: Callable[[T], Awaitable[R]],
) -> list[R]:
    """Start ``job(jobs[i])`` at ``offsets[i]`` seconds from now; results in job order.

    Concurrency limits are the job's business (it enters a shared `Limiter` around each
    request), so a multi-turn session can hold the cap per turn, not per session.
    """
    if len(jobs) != len(offsets):
        raise ValueError(f"{len(jobs)} jobs but {len(offsets)} offsets")
    start = time.perf_counter()

    async def one(item: T, offset: float) -> R:
        await _wait_until(start, offset)
        return await job(item)

    return list(await asyncio.gather(*(one(j, o) for j, o in zip(jobs, offsets, strict=True))))
