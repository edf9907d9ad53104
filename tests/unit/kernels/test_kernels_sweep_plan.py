"""The H200 sweep script's CPU side: its plan is well formed and ``--dry-run`` needs no GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "kernels" / "sweep_gqa_moe.py"


@pytest.fixture(scope="module")
def sweep(load_script):
    return load_script(SCRIPT, siblings=True)  # the script imports its sibling ``common``


def test_plan_covers_every_target_shape_with_the_default_first(sweep):
    cases = sweep.plan(None, False, 132)
    shapes = {c.label for c in cases}
    assert {f"decode b={b} kv={n} page={p}" for b, n in sweep.DECODE_SHAPES
            for p in sweep.DECODE_PAGES} <= shapes  # fmt: skip
    assert {f"moe tokens={t}" for t in sweep.MOE_TOKENS} <= shapes
    first = {}
    for case in cases:
        first.setdefault(case.label, case.variant)
    assert set(first.values()) == {"default"}
    assert len({(c.label, c.variant) for c in cases}) == len(cases)


def test_quick_plan_is_a_smaller_subset(sweep):
    full = {(c.label, c.variant) for c in sweep.plan(None, False, 132)}
    quick = {(c.label, c.variant) for c in sweep.plan(None, True, 132)}
    assert quick < full and 2 * len(quick) <= len(full) + 10
    assert {c.op for c in sweep.plan("moe", True, 132)} == {"moe"}


def test_decode_configs_are_valid_and_fit_one_wave(sweep):
    from tokenspeed.kernels.triton_ops.decode_attention import _check_config

    for case in sweep.plan("decode", False, 132):
        cfg, d = case.config, case.dims
        _check_config(cfg, d["page_size"])
        if "maxnreg" in cfg:
            ctas = 65536 // (cfg["maxnreg"] * 32 * cfg["num_warps"])
            programs = d["batch"] * 8 * cfg["num_splits"]
            assert programs <= ctas * 132, case


def test_moe_configs_name_known_switches(sweep):
    from tokenspeed.kernels.triton_ops.fused_moe import _check_config

    for case in sweep.plan("moe", False, 132):
        _check_config(case.config)
        if case.config.get("path") == "sortfree":
            assert case.dims["tokens"] <= 32


def test_dry_run_prints_the_plan_without_a_gpu(sweep, capsys):
    assert sweep.main(["--dry-run", "--quick"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(sweep.plan(None, True, 132))
    assert any('"tma": true' in line for line in lines)
    assert any('"path": "sortfree"' in line for line in lines)


def test_the_run_records_every_case_and_survives_broken_variants(sweep, monkeypatch, tmp_path):
    """The GPU path end to end on CPU: tiny shapes, float32, interpreted kernels, a fake clock.

    A variant with an invalid config must come out as an error row, not stop the run.
    """
    import json

    from tokenspeed.kernels.device import triton_available
    from tokenspeed.kernels.timing import Timing

    if not triton_available():
        pytest.skip("triton is not installed")
    small = {"DEVICE": "cpu", "DTYPE": torch.float32, "DECODE_SHAPES": ((3, 100),),
             "DECODE_PAGES": (16,), "MOE_TOKENS_QUICK": (1, 3),
             "HEADS": {"num_q_heads": 8, "num_kv_heads": 2, "head_dim": 32},
             "MOE": {"hidden": 64, "intermediate": 32, "num_experts": 8, "top_k": 2,
                     "w2_order": "k"}}  # fmt: skip
    for name, value in small.items():
        monkeypatch.setattr(sweep, name, value)
    monkeypatch.setattr(sweep, "_sms", lambda: 2)
    monkeypatch.setattr(sweep, "_l2", lambda: 1 << 16)
    monkeypatch.setattr(
        sweep, "_bounds", lambda: {"copy_gbps": 100.0, "read_gbps": 110.0, "bf16_tflops": 10.0}
    )

    def fake_time(fn, sets, replays):
        for inputs in sets:
            fn(inputs)
        return Timing(10.0, 9.0, 11.0, replays, "fake")

    monkeypatch.setattr(sweep, "_time", fake_time)
    decode_variants = sweep._decode_variants

    def with_a_broken_one(d, sms):
        yield from decode_variants(d, sms)
        yield "broken", {"block_n": 64, "num_warps": 4, "num_stages": 2, "num_splits": 2,
                         "merge": "bogus"}, True  # fmt: skip

    monkeypatch.setattr(sweep, "_decode_variants", with_a_broken_one)
    out = tmp_path / "sweep.json"
    keep = "default,wave,n32-carry-s3,fewer-launches,sortfree-expert,broken"
    argv = ["--out", str(out), "--quick", "--variants", keep, "--compile-workers", "2"]
    args = sweep.parse_args(argv)
    assert sweep.sweep(args) == 0
    report = json.loads(out.read_text())
    assert report["parallel_compile"].startswith("6/7 cases in 2 workers")  # all but broken
    rows = report["results"]
    status = {(r["case"], r["variant"]): r["status"] for r in rows}
    assert status.pop(("decode b=3 kv=100 page=16", "broken")) == "error"
    assert status and set(status.values()) == {"ok"}, status
    ran = {v for _, v in status}  # identical configs (e.g. one split either way) run once
    assert ran <= set(keep.split(",")) and {"default", "fewer-launches"} <= ran
    # at this tiny shape the default is n32-carry-s3 with one split: that variant runs once
    assert "wave" in ran and "n32-carry-s3" not in ran
    assert all(r["correct"] and r["median_us"] == 10.0 for r in rows if r["status"] == "ok")
