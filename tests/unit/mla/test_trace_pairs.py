"""The pairs-decode tracer's CPU side: which pairs it reads (the middle ones of each traced
CTA), the times it reports (after the group's own pair start; a scores part's full-barrier
wait), and that it refuses to run without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "mla" / "trace_pairs.py"


@pytest.fixture(scope="module")
def tracer(load_script):
    return load_script(SCRIPT)


def _trace(tracer, pairs: int, ctas: int = 2) -> torch.Tensor:
    """Group 0 of every CTA: pair ``p`` starts at 10 us * (p + 1), waits 0.3 us for its lo
    part 0.1 us in, issues P_A's product 1 us in, leaves 4 us in; pair 3 waits 5 us (an
    outlier the median must shrug off)."""
    t = torch.zeros(ctas, 2, tracer.MAX_PAIRS, tracer.EVENTS, dtype=torch.int64)
    for cta in range(ctas):
        for p in range(pairs):
            start = 10_000 * (p + 1)
            wait = 5_000 if p == 3 else 300
            t[cta, 0, p, tracer.BODY_IN] = start
            t[cta, 0, p, tracer.SCORES_WAIT] = start + 100
            t[cta, 0, p, tracer.SCORES_ISSUED] = start + 100 + wait
            t[cta, 0, p, tracer.VALUES] = start + 1_000
            t[cta, 0, p, tracer.BODY_OUT] = start + 4_000
    return t


def test_medians_over_the_middle_pairs_after_each_pair_start(tracer):
    got = tracer.summarise(_trace(tracer, pairs=10))
    g0 = got["group0"]
    assert g0["pairs"] == 2 * 6  # two CTAs, pairs 2-7 (the ring fills and drains outside)
    assert g0["scores_full_wait_lo_us"] == pytest.approx(0.3)
    assert g0["values_A_us"] == pytest.approx(1.0)
    assert g0["body_out_us"] == pytest.approx(4.0)
    assert "scores_full_wait_rope_us" not in g0  # never stamped: the halves layout
    assert "group1" not in got  # nothing traced for it


def test_too_few_pairs_report_nothing(tracer):
    assert tracer.summarise(_trace(tracer, pairs=4)) == {}


def test_every_event_has_a_name_and_a_slot(tracer):
    assert sorted(tracer.NAMES) == list(range(tracer.EVENTS))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_without_a_gpu_it_says_so(tracer, capsys):
    assert tracer.main(["--heads", "64"]) == 2
    assert "CUDA" in capsys.readouterr().err
