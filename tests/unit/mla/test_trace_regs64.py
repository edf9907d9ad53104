"""The 64-row register decode's tracer, CPU side: which tiles it reads for a group (its own,
the middle ones), how it pairs a tile with the other group's tile before it, and that it
refuses to run without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "mla" / "trace_regs64.py"


@pytest.fixture(scope="module")
def tracer(load_script):
    return load_script(SCRIPT, siblings=True)


def _trace(tracer, tiles: int) -> torch.Tensor:
    """Both groups of one CTA, warp 0, on a 1 GHz clock. Group g scores tiles g, g + 2, ...
    every 5 000 cycles (1 000 of scores, 800 waiting), multiplies the other group's tile
    before its softmax (700), then runs the softmax (600) and its own tile's values (900);
    tile 6's wait is 9 000 (an outlier)."""
    t = torch.zeros(1, 2, tracer.WARPS, tracer.MAX_TILES, tracer.EVENTS, 2, dtype=torch.int64)

    def at(group: int, tile: int, event: int, cycle: int) -> None:
        t[0, group, 0, tile, event] = torch.tensor([cycle, cycle])  # clock, ns

    for u in range(tiles):
        g = u % 2
        start = 2_500 * u + 100
        wait = 9_000 if u == 6 else 800
        at(g, u, tracer.SCORES_IN, start)
        at(g, u, tracer.SCORES_OUT, start + 1_000)
        if u >= 1:  # the other group's tile u - 1, multiplied by this group
            at(g, u - 1, tracer.VALUES_IN, start + 1_000 + wait)
            at(g, u - 1, tracer.VALUES_OUT, start + 1_700 + wait)
        at(g, u, tracer.SOFTMAX_IN, start + 1_800 + wait)
        at(g, u, tracer.SOFTMAX_OUT, start + 2_400 + wait)
        at(g, u, tracer.VALUES_IN, start + 2_500 + wait)
        at(g, u, tracer.VALUES_OUT, start + 3_400 + wait)
    return t


def test_phases_per_own_tile(tracer):
    out = tracer.summarise(_trace(tracer, 30))
    for group in (0, 1):
        row = out[f"group{group}"]
        assert row["scores_cycles"] == 1_000 and row["softmax_cycles"] == 600
        assert row["wait_cycles"] == 800  # the outlier does not move the median
        assert row["values_other_cycles"] == 700 and row["values_own_cycles"] == 900
        assert row["period_cycles"] == 5_000
        # own tiles 2 .. 12 of 15 (two left out at each end), the last needing tile u + 2
        assert row["tiles"] == 11
    assert out["sm_ghz"] == pytest.approx(1.0, rel=0.01)


def test_refuses_without_a_gpu(tracer, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert tracer.main(["--heads", "128"]) == 2
