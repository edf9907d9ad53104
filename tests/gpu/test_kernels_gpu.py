"""Triton kernels on a real GPU: bf16 (and fp16) against the torch reference, at model shapes.

Skipped without CUDA, and when ``TRITON_INTERPRET=1`` is set (then Triton would interpret
instead of compiling; run ``pytest tests/gpu`` in its own process).
"""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") == "1", reason="Triton interpreter is on"
    ),
]

LLAMA = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128}
CASES = [
    ("norm.rms", {"tokens": 1, "hidden": 4096}),
    ("norm.rms", {"tokens": 333, "hidden": 8192}),
    ("norm.rms", {"tokens": 64, "hidden": 128}),  # per-head q/k norm rows
    ("norm.fused_add_rms", {"tokens": 257, "hidden": 4096}),
    ("rotary.apply", {"tokens": 100, **LLAMA, "rot_dim": 128, "is_neox": True}),
    ("rotary.apply", {"tokens": 100, **LLAMA, "rot_dim": 64, "is_neox": False}),
    ("activation.silu_and_mul", {"tokens": 77, "intermediate": 14336}),
    ("kv_cache.store", {"tokens": 300, "num_kv_heads": 8, "head_dim": 128, "page_size": 16}),
    ("attention.decode", {"batch": 8, "kv_len": 2000, **LLAMA, "page_size": 16}),
    ("attention.decode", {"batch": 3, "kv_len": 8191, **LLAMA, "page_size": 64}),
    (
        "attention.decode",
        {
            "batch": 5,
            "kv_len": 129,
            "num_q_heads": 16,
            "num_kv_heads": 16,
            "head_dim": 64,
            "page_size": 1,
        },
    ),
    ("attention.extend", {"batch": 1, "q_len": 1000, "prefix_len": 0, **LLAMA, "page_size": 16}),
    ("attention.extend", {"batch": 3, "q_len": 77, "prefix_len": 500, **LLAMA, "page_size": 64}),
    # Dense batch, no prefix, page-aligned: the SDPA candidate is feasible (and the default).
    ("attention.extend", {"batch": 2, "q_len": 1024, "prefix_len": 0, **LLAMA, "page_size": 64}),
    ("moe.route", {"tokens": 100, "num_experts": 128, "top_k": 8, "scoring": "softmax"}),
    (
        "moe.route",
        {
            "tokens": 100,
            "num_experts": 256,
            "top_k": 8,
            "scoring": "sigmoid",
            "n_group": 8,
            "topk_group": 4,
        },
    ),
    (
        "moe.experts",
        {"tokens": 1, "hidden": 2048, "intermediate": 768, "num_experts": 128, "top_k": 8},
    ),
    (
        "moe.experts",
        {"tokens": 200, "hidden": 2048, "intermediate": 768, "num_experts": 128, "top_k": 8},
    ),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("op", "shape"), CASES, ids=[f"{op}-{i}" for i, (op, _) in enumerate(CASES)]
)
def test_triton_kernel_matches_reference(op, shape, dtype):
    from tokenspeed.kernels.numerics import check_op

    results = check_op(op, shape, dtype, torch.device("cuda"), seed=0)
    triton_results = [r for r in results if r.kernel.startswith("triton_")]
    assert triton_results, results
    for r in triton_results:
        assert r.passed, r
    for r in results:  # every other candidate that was feasible here (e.g. SDPA extend)
        assert r.passed is not False, r


def test_triton_is_the_default_choice_on_cuda():
    from tokenspeed.kernels import explain_selection
    from tokenspeed.kernels.catalog import OPS

    for family, mode, _, _ in OPS:
        expl = explain_selection(family, mode, {}, traits={}, device="cuda")
        # attention.extend: the SDPA candidate (PERFORMANT) wins where its traits hold, and
        # attention.decode the CuTe DSL one (SPECIALIZED) on Hopper where CuTe DSL is installed.
        allowed = {
            ("attention", "extend"): ("triton_", "sdpa_"),
            ("attention", "decode"): ("triton_", "cute_"),
        }.get((family, mode), ("triton_",))
        assert expl.chosen.startswith(allowed), expl


def test_extend_picks_sdpa_for_dense_batches_and_triton_otherwise():
    from tokenspeed.kernels import clear_selection_cache, selection_records
    from tokenspeed.kernels.workloads import call_op, make_inputs

    for prefix, want in ((0, "sdpa_paged_extend"), (100, "triton_paged_extend")):
        shape = {"batch": 1, "q_len": 512, "prefix_len": prefix, **LLAMA, "page_size": 64}
        clear_selection_cache(records=True)  # records are sorted by bucket, not by time
        call_op("attention.extend", make_inputs("attention.extend", shape, torch.bfloat16, "cuda"))
        (rec,) = [r for r in selection_records() if r["op"] == "attention.extend"]
        assert rec["kernel"] == want, rec


@pytest.mark.parametrize(
    "op", ["attention.decode", "attention.extend", "moe.experts", "moe.route", "kv_cache.store"]
)
def test_ops_are_cuda_graph_capturable(op):
    """No host synchronisation in the ops' hot paths: capture must succeed and replay match."""
    from tokenspeed.kernels.workloads import call_op, make_inputs, outputs

    # extend: its last case, the dense batch the SDPA candidate runs; other ops: the first.
    cases = reversed(CASES) if op == "attention.extend" else CASES
    shape = dict(next(s for o, s in cases if o == op))
    inputs = make_inputs(op, shape, torch.bfloat16, "cuda")
    eager = [t.clone() for t in outputs(op, inputs, call_op(op, inputs))]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call_op(op, inputs)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(outputs(op, inputs, captured), eager, strict=True):
        torch.testing.assert_close(a, b)
