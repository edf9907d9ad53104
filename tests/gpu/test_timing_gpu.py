"""``time_gpu_interleaved`` on a real GPU: every call gets one sample per replay, and the
samples measure the calls themselves (a spin twice as long reads about twice as long)."""

from __future__ import annotations

import statistics

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_interleaved_samples_pair_up_and_measure_each_call():
    from tokenspeed.kernels.timing import time_gpu_interleaved

    cycles = 200_000
    calls = [
        lambda: torch.cuda._sleep(cycles),
        lambda: torch.cuda._sleep(2 * cycles),
        lambda: torch.cuda._sleep(cycles),
    ]
    samples = time_gpu_interleaved(calls, replays=24)
    assert [len(s) for s in samples] == [24, 24, 24]
    assert all(us > 0 for s in samples for us in s)
    ratios = [b / a for a, b in zip(samples[0], samples[1], strict=True)]
    assert 1.7 < statistics.median(ratios) < 2.3
    same = [c / a for a, c in zip(samples[0], samples[2], strict=True)]
    assert 0.9 < statistics.median(same) < 1.1
