"""Load shaping: gamma/Poisson arrivals with a fixed seed, and the concurrency cap."""

from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import pytest

from tokenspeed_cli.bench.load import Limiter, arrival_offsets, run_at_offsets


def test_infinite_rate_sends_everything_at_once() -> None:
    assert arrival_offsets(5, math.inf) == [0.0] * 5
    assert arrival_offsets(0, 3.0) == []


def test_offsets_are_seeded_gamma_gaps() -> None:
    offsets = arrival_offsets(6, rate=4.0, burstiness=2.0, seed=11)
    gaps = np.random.default_rng(11).gamma(shape=2.0, scale=1 / 8.0, size=5)
    assert offsets[0] == 0.0
    assert np.allclose(np.diff(offsets), gaps)
    assert offsets == arrival_offsets(6, rate=4.0, burstiness=2.0, seed=11)
    assert offsets != arrival_offsets(6, rate=4.0, burstiness=2.0, seed=12)


@pytest.mark.parametrize(("burstiness", "cv"), [(1.0, 1.0), (4.0, 0.5), (0.25, 2.0)])
def test_gap_statistics(burstiness: float, cv: float) -> None:
    gaps = np.diff(arrival_offsets(40001, rate=10.0, burstiness=burstiness, seed=0))
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)  # mean gap = 1 / rate
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.08)  # CV = 1/sqrt(shape)


def test_bad_rate() -> None:
    with pytest.raises(ValueError):
        arrival_offsets(3, 0.0)
    with pytest.raises(ValueError):
        Limiter(0)


def test_concurrency_cap_is_respected_and_reached() -> None:
    limiter = Limiter(3)
    seen: list[int] = []

    async def job(i: int) -> int:
        async with limiter:
            seen.append(limiter.in_flight)
            await asyncio.sleep(0.01)
        return i * 2

    out = asyncio.run(run_at_offsets(list(range(12)), [0.0] * 12, job))
    assert out == [i * 2 for i in range(12)]  # results keep job order
    assert max(seen) == 3 and limiter.peak == 3 and limiter.in_flight == 0


def test_no_cap_runs_all_together() -> None:
    limiter = Limiter(None)

    async def job(_: int) -> None:
        async with limiter:
            await asyncio.sleep(0.01)

    asyncio.run(run_at_offsets(list(range(8)), [0.0] * 8, job))
    assert limiter.peak == 8


def test_jobs_do_not_start_before_their_offset() -> None:
    starts: dict[int, float] = {}
    offsets = [0.0, 0.05, 0.02]

    async def job(i: int) -> None:
        starts[i] = time.perf_counter()

    t0 = time.perf_counter()
    asyncio.run(run_at_offsets([0, 1, 2], offsets, job))
    for i, off in enumerate(offsets):
        assert starts[i] - t0 >= off
    assert starts[0] < starts[2] < starts[1]
