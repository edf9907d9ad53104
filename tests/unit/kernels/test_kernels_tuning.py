"""Tuning end to end on CPU: the GPU timer is replaced, everything else is real.

The Triton kernels run in the interpreter on a pretend H200, so the captured buckets, the
config spaces, the winner and the written file are the ones a GPU run would produce.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import tokenspeed.kernels as K
from tokenspeed.kernels import tuning
from tokenspeed.kernels.device import DeviceInfo, triton_available
from tokenspeed.kernels.model_shapes import ModelShapes, load_model_shapes
from tokenspeed.kernels.timing import Timing

H200 = DeviceInfo(kind="cuda", vendor="nvidia", name="NVIDIA H200", compute=(9, 0), num_sms=132)
TINY = ModelShapes(name="tiny", hidden=64, num_q_heads=4, num_kv_heads=2, head_dim=32, rot_dim=32,
                   intermediate=96, num_experts=4, moe_intermediate=32, top_k=2)  # fmt: skip


def test_model_shapes_from_config_json(tmp_path):
    config = {
        "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "intermediate_size": 6144, "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    shapes = load_model_shapes(str(tmp_path), tp_size=2)
    assert (shapes.hidden, shapes.num_q_heads, shapes.num_kv_heads, shapes.head_dim) == (
        2048,
        16,
        2,
        128,
    )
    assert (shapes.num_experts, shapes.top_k, shapes.moe_intermediate) == (128, 8, 384)
    assert load_model_shapes("qwen3-30b-a3b").num_experts == 128
    with pytest.raises(FileNotFoundError):
        load_model_shapes(str(tmp_path / "missing"))


def test_cases_cover_the_model_buckets():
    cases = tuning.tuning_cases(TINY, tuning.TUNABLE_OPS)
    assert {c.op for c in cases} == set(tuning.TUNABLE_OPS)
    dense = ModelShapes(
        name="d", hidden=64, num_q_heads=4, num_kv_heads=2, head_dim=32, rot_dim=32, intermediate=96
    )
    assert not {c.op for c in tuning.tuning_cases(dense, tuning.TUNABLE_OPS)} & {
        "moe.route",
        "moe.experts",
    }
    decode = [c.shape for c in cases if c.op == "attention.decode"]
    assert all(s["batch"] * s["kv_len"] <= tuning.MAX_DECODE_TOKENS for s in decode)


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_tune_finds_the_fastest_config_and_the_selector_uses_it(monkeypatch, tmp_path):
    from tokenspeed.kernels.triton_ops.configs import moe_config_space

    case = tuning.TuneCase(
        "moe.experts", {"tokens": 3, "hidden": 64, "intermediate": 32, "num_experts": 4, "top_k": 2}
    )
    winner = tuning._thin(moe_config_space({"num_tokens": 4, "top_k": 2, "num_experts": 4}), 6)[-1]
    timed: list[dict] = []

    def fake_time(fn, sets, replays=20):
        fn(sets[0])  # the kernel really runs (interpreted)
        cfg = fn.__closure__ and next(
            (c.cell_contents for c in fn.__closure__ if isinstance(c.cell_contents, dict)), None
        )
        timed.append(cfg)
        return Timing(5.0 if cfg == winner else 10.0, 0, 0, 1, "fake")

    monkeypatch.setattr(tuning, "device_info", lambda device: H200)
    monkeypatch.setattr(tuning, "time_gpu", fake_time)
    monkeypatch.setattr(tuning, "rotating", lambda make, nbytes: [make(0)])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    table, results = tuning.tune(
        [case], dtype=torch.float32, device=torch.device("cpu"), max_configs=6
    )

    (result,) = results
    assert result.best_kernel == "triton_fused_moe" and result.best_config == winner
    assert result.speedup == pytest.approx(2.0) and result.tried == 7  # default + 6 configs
    assert "num_tokens=4" in result.bucket and "x=float32" in result.bucket
    path = table.save(tmp_path / "h200.json")
    K.load_tuning_file(path)
    signature, traits = _signature_and_traits(case)
    sel = K.select_kernel("moe", "experts", signature, traits=traits, device=H200)
    assert sel.name == "triton_fused_moe" and dict(sel.config) == winner
    assert "2.00x" in sel.reason


def _signature_and_traits(case):
    from tokenspeed.kernels.selection import capture_dispatch
    from tokenspeed.kernels.workloads import call_op, make_inputs

    with capture_dispatch() as calls:
        call_op(case.op, make_inputs(case.op, case.shape, torch.float32, "cpu"))
    return calls[0].signature, calls[0].traits


def test_cli_without_cuda_exits_nonzero_with_one_clear_line():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    code = (
        "import typer, sys\n"
        "from tokenspeed_cli.tune_kernels import tune_kernels\n"
        "app = typer.Typer(); app.command('tune-kernels')(tune_kernels)\n"
        "@app.command()\ndef noop(): pass\n"
        "app(['tune-kernels', '--model', 'qwen3-8b'])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert "nothing to tune" in result.stdout
