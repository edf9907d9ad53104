"""The MLA decode sweep's CPU side: readings over rounds are summarised by their median and
spread and, round by round, against the first variant; the script refuses to run without a
GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "mla" / "sweep_decode.py"


@pytest.fixture(scope="module")
def sweep(load_script):
    return load_script(SCRIPT)


def test_rounds_report_the_median_and_the_spread(sweep):
    got = sweep.summarise_rounds([321.2, 297.9, 301.5, 299.0])
    assert got["round_us"] == [321.2, 297.9, 301.5, 299.0]
    assert got["round_median_us"] == pytest.approx(300.25)  # an outlier does not move it far
    assert got["round_spread_us"] == [297.9, 321.2]
    assert sweep.summarise_rounds([150.0])["round_median_us"] == 150.0


def test_each_round_pairs_a_variant_with_the_first(sweep):
    """Ratios are taken within a round (both timed back to back), not between the medians:
    a round where the whole machine was slow moves neither variant's ratio."""
    got = sweep.paired_ratios([110.0, 220.0, 99.0], [100.0, 200.0, 100.0])
    assert got["ratio_to_first"] == pytest.approx([1.1, 1.1, 0.99])
    assert got["ratio_median"] == pytest.approx(1.1)
    assert got["ratio_spread"] == pytest.approx([0.99, 1.1])
    with pytest.raises(ValueError):  # every variant is timed in every round
        sweep.paired_ratios([1.0, 2.0], [1.0])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_without_a_gpu_it_says_so(sweep, capsys):
    assert sweep.main(["--heads", "64", "--rounds", "3"]) == 2
    assert "CUDA" in capsys.readouterr().err


def test_interleaved_samples_report_the_median_and_the_quartiles(sweep):
    got = sweep.summarise_samples([10.0, 11.0, 12.0, 13.0, 50.0])
    assert got["sample_median_us"] == 12.0
    lo, hi = got["sample_iqr_us"]
    assert 10.0 <= lo <= 11.0 and 13.0 <= hi < 50.0  # the outlier stays outside
    assert sweep.summarise_samples([7.0])["sample_iqr_us"] == [7.0, 7.0]


def test_ratios_carry_their_quartiles(sweep):
    """Many interleaved samples: the interquartile range, not the extremes, says whether a
    difference of a few per cent is one."""
    base = [100.0] * 8
    got = sweep.paired_ratios([98.0, 98.0, 99.0, 99.0, 99.0, 99.0, 100.0, 130.0], base)
    assert got["ratio_median"] == pytest.approx(0.99)
    lo, hi = got["ratio_iqr"]
    assert 0.98 <= lo <= 0.99 <= hi <= 1.0
    assert got["ratio_spread"] == pytest.approx([0.98, 1.3])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_batch_sets_the_requests_the_metrics_count(sweep, monkeypatch):
    """``--batch 132`` (one CTA per H200 SM at 64 heads) is what the bytes and FLOPs count."""
    monkeypatch.setattr(sweep, "BATCH", sweep.BATCH)  # put back after the test
    bounds = {"copy_gbps": 4000.0, "bf16_tflops": 700.0}
    base = sweep._metrics(64, 1, 100.0, bounds, "")
    assert sweep.main(["--batch", "132"]) == 2  # no GPU here, but the batch is taken
    assert sweep.BATCH == 132
    got = sweep._metrics(64, 1, 100.0, bounds, "")
    assert got["tflops"] == pytest.approx(base["tflops"] * 132 / 128)
    assert got["gbps"] == pytest.approx(base["gbps"] * 132 / 128)


def test_other_triton_modules_are_timed_after_the_first_variant(load_script):
    """``sweep_triton_modules.py`` adds ``triton <module>`` for each module named, right after
    the reference variant, and ``--variants`` still selects."""
    script = SCRIPT.with_name("sweep_triton_modules.py")
    mods = load_script(script, siblings=True)
    variants = mods.with_modules(["triton_decode"])
    names = [name for name, _ in variants(16, 1)]
    assert names[:3] == ["triton default", "triton triton_decode", "registry"]
    picked = variants(16, 1, {"triton default", "triton triton_decode"})
    assert [name for name, _ in picked] == ["triton default", "triton triton_decode"]
