"""The MLA decode timeline's CPU side: per-CTA stamps become quantiles of start, end, tile
time and epilogue (two consumer groups: from the first group in to the last group out), CTAs
that never stamped are left out, and the script refuses to run without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "mla" / "timeline_decode.py"


@pytest.fixture(scope="module")
def timeline(load_script):
    return load_script(SCRIPT)


def _clock(t, rows: list[dict[int, int]]) -> torch.Tensor:
    clock = torch.zeros(len(rows) + 2, t.SLOTS, dtype=torch.int64)  # two rows never stamped
    for i, row in enumerate(rows):
        for slot, ns in row.items():
            clock[i, slot] = ns
    return clock


def test_one_group_kernel(timeline):
    t = timeline
    base = 10**12  # %globaltimer counts from an arbitrary epoch
    rows = [
        {t.START: base, t.SM: 3, t.LAST_LOAD: base + 96_000, t.EPI0_IN: base + 100_000,
         t.EPI0_OUT: base + 101_000},
        {t.START: base + 1_000, t.SM: 7, t.LAST_LOAD: base + 118_000,
         t.EPI0_IN: base + 121_000, t.EPI0_OUT: base + 124_000},
    ]  # fmt: skip
    got = t.summarise(_clock(t, rows))
    assert got["ctas"] == 2 and got["sms"] == 2
    assert got["span_us"] == pytest.approx(124.0)
    assert got["start_us"] == {"0": 0.0, "0.5": 1.0, "0.9": 1.0, "1": 1.0}
    assert got["end_us"]["0"] == pytest.approx(101.0) and got["end_us"]["1"] == 124.0
    assert got["tiles_us"]["0"] == pytest.approx(100.0) and got["tiles_us"]["1"] == 120.0
    assert got["epilogue_us"]["0"] == pytest.approx(1.0) and got["epilogue_us"]["1"] == 3.0
    assert got["last_load_to_epilogue_us"]["1"] == pytest.approx(4.0)


def test_two_groups_span_from_first_in_to_last_out(timeline):
    t = timeline
    row = {t.START: 5_000, t.SM: 0, t.LAST_LOAD: 90_000, t.EPI0_IN: 100_000,
           t.EPI0_OUT: 102_000, t.EPI1_IN: 99_000, t.EPI1_OUT: 103_500}  # fmt: skip
    got = t.summarise(_clock(t, [row]))
    assert got["tiles_us"]["0"] == pytest.approx(94.0)  # group 1 finished its tiles first
    assert got["epilogue_us"]["0"] == pytest.approx(4.5)
    assert got["span_us"] == pytest.approx(98.5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_without_a_gpu_it_says_so(timeline, capsys):
    assert timeline.main(["--heads", "64"]) == 2
    assert "CUDA" in capsys.readouterr().err
