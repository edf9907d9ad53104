"""MLA prefill: the Triton kernel's launch variants and the SDPA (cuDNN) candidate, on CPU.

Triton runs in its interpreter (float32/float16; bf16 ``tl.dot`` is wrong there) against
float64 math; outputs are pre-filled with NaN so a row a kernel forgets to write fails.
Every variant sees requests that span several query blocks and several unmasked key tiles,
a cached prefix, a one-token request, and GQA. The TMA path is forced on CPU (the interpreter
accepts host tensor descriptors) to check its coordinates, including a strided V view.
"""

from __future__ import annotations

import pytest
import torch
from mla_float64 import cu, prefill64

import tokenspeed.mla as M
from tokenspeed.kernels import explain_selection, kernel_override, selection_records
from tokenspeed.kernels.device import DeviceInfo, triton_available
from tokenspeed.kernels.selection import capture_dispatch
from tokenspeed.mla import configs, reference, sdpa_prefill

H200 = DeviceInfo(kind="cuda", vendor="nvidia", name="NVIDIA H200", compute=(9, 0), num_sms=132)
A100 = DeviceInfo(kind="cuda", vendor="nvidia", name="NVIDIA A100", compute=(8, 0), num_sms=108)
TOL = {torch.float32: dict(atol=3e-5, rtol=3e-5), torch.float16: dict(atol=1.5e-2, rtol=1.5e-2)}
# No prefix, prefix 41, one token, prefix 33, and one request over three 32-row blocks.
Q_LENS, KV_LENS = [1, 20, 5, 70], [1, 61, 38, 70]
needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed")


def _inputs(dtype, heads=4, heads_kv=2, d_qk=48, d_v=32, q_lens=Q_LENS, kv_lens=KV_LENS):
    """Ragged q/k/v (q/k dim 48 = 32 + 16: the split-dim path); V is a strided view."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(sum(q_lens), heads, d_qk, generator=gen).to(dtype)
    k = torch.randn(sum(kv_lens), heads_kv, d_qk, generator=gen).to(dtype)
    kv = torch.randn(sum(kv_lens), heads_kv, 2 * d_v, generator=gen).to(dtype)
    return q, k, kv[..., d_v:]  # V out of a wider projection: head stride 2 * d_v


def _small(cfg: dict) -> dict:
    """A variant at interpreter-sized tiles (same warps/stages/tma keys)."""
    return {**cfg, "block_m": 32 if cfg["block_m"] >= 128 else 16, "block_n": 16}


@needs_triton
@pytest.mark.parametrize("variant", sorted(configs.PREFILL_VARIANTS))
@pytest.mark.parametrize(("dtype", "causal"), [(torch.float32, True), (torch.float16, False)])
def test_triton_variants_match_float64(monkeypatch, variant, dtype, causal):
    from tokenspeed.mla import triton_prefill

    cfg = configs.PREFILL_VARIANTS[variant]
    if cfg.get("tma"):
        monkeypatch.setattr(triton_prefill, "_tma_ok", lambda *tensors: True)
    q, k, v = _inputs(dtype)
    out = torch.full((q.shape[0], q.shape[1], v.shape[-1]), float("nan"), dtype=dtype)
    res, lse = triton_prefill.mla_prefill(
        q, k, v, cu(Q_LENS), cu(KV_LENS), softmax_scale=0.2, causal=causal, return_lse=True,
        out=out, max_seqlen_q=max(Q_LENS) if variant == "m64" else None, config=_small(cfg),
    )  # fmt: skip
    exp, exp_lse = prefill64(q, k, v, Q_LENS, KV_LENS, 0.2, causal)
    assert res is out
    torch.testing.assert_close(out.double(), exp, **TOL[dtype])
    torch.testing.assert_close(lse.double(), exp_lse, **TOL[dtype])


@needs_triton
def test_tma_descriptor_columns_follow_the_head_stride():
    """Head h's columns start at h * stride_h in the 2-D view (V strided out of [T, H, 2D])."""
    from tokenspeed.mla.triton_prefill import _descriptor

    _, k, v = _inputs(torch.float32)
    desc = _descriptor(v, 16, v.shape[-1])
    assert list(desc.shape) == [v.shape[0], (v.shape[1] - 1) * v.stride(1) + v.shape[2]]
    assert list(desc.strides) == [v.stride(0), 1]
    assert desc.base.data_ptr() == v.data_ptr()
    assert list(_descriptor(k, 16, 32).block_shape) == [16, 32]


def test_variants_are_full_configs():
    """Every named variant sets every key the default has (nothing silently defaulted)."""
    keys = set(configs.prefill_default_config({"num_tokens": 8192}))
    for name, cfg in configs.PREFILL_VARIANTS.items():
        assert set(cfg) == keys, name


# -- the SDPA candidate ----------------------------------------------------------------------


def _dense(dtype, heads=4, heads_kv=4, tokens=45):
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(tokens, heads, 192, generator=gen).to(dtype)
    k = torch.randn(tokens, heads_kv, 192, generator=gen).to(dtype)
    proj = torch.randn(tokens, heads_kv, 256, generator=gen).to(dtype)
    return q, k, proj[..., :128]  # a strided V, as split out of the kv projection


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("heads_kv", "gqa"), [(4, "expand"), (2, "expand"), (2, "native")])
def test_sdpa_candidate_matches_float64_and_reference(dtype, causal, heads_kv, gqa):
    q, k, v = _dense(dtype, heads_kv=heads_kv)
    lens = [q.shape[0]]
    out = torch.full((q.shape[0], 4, 128), float("nan"), dtype=dtype)
    res = sdpa_prefill.mla_prefill(q, k, v, cu(lens), cu(lens), softmax_scale=0.07,
                                   causal=causal, out=out, config={"gqa": gqa})  # fmt: skip
    assert res is out
    exp, _ = prefill64(q, k, v, lens, lens, 0.07, causal)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.double(), exp, **tol)
    ref = reference.mla_prefill(q, k, v, cu(lens), cu(lens), softmax_scale=0.07, causal=causal)
    torch.testing.assert_close(res.float(), ref.float(), **tol)
    fresh = sdpa_prefill.mla_prefill(q, k, v, cu(lens), cu(lens), softmax_scale=0.07,
                                     causal=causal, config={"gqa": gqa})  # fmt: skip
    assert fresh.shape == (q.shape[0], 4, 128) and fresh.is_contiguous()
    torch.testing.assert_close(fresh, res, atol=0, rtol=0)


def test_sdpa_candidate_refuses_what_it_cannot_compute():
    q, k, v = _dense(torch.float32)
    lens = [q.shape[0]]
    with pytest.raises(ValueError, match="LSE"):
        sdpa_prefill.mla_prefill(q, k, v, cu(lens), cu(lens), softmax_scale=0.1, return_lse=True)
    with pytest.raises(ValueError, match="one request"):
        sdpa_prefill.mla_prefill(q, k, v, cu([20, 25]), cu([20, 25]), softmax_scale=0.1)
    with pytest.raises(ValueError, match="one request"):
        sdpa_prefill.mla_prefill(q[:30], k, v, cu([30]), cu(lens), softmax_scale=0.1)


def _traits(q_lens, kv_lens, *, dtype=torch.bfloat16, return_lse=False, heads_kv=4):
    """Signature and traits the public op asks the selector for (captured from a real call)."""
    q, k, v = _dense(dtype, heads_kv=heads_kv, tokens=max(sum(q_lens), sum(kv_lens)))
    q, k, v = q[: sum(q_lens)], k[: sum(kv_lens)], v[: sum(kv_lens)]
    with capture_dispatch() as calls:
        M.mla_prefill(q, k, v, cu(q_lens), cu(kv_lens), softmax_scale=0.1, return_lse=return_lse)
    (call,) = [c for c in calls if c.op == "mla.prefill"]
    return call.signature, call.traits


@needs_triton
@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (dict(q_lens=[40], kv_lens=[40]), "sdpa_mla_prefill"),
        (dict(q_lens=[40], kv_lens=[40], heads_kv=2), "sdpa_mla_prefill"),
        (dict(q_lens=[20, 20], kv_lens=[20, 20]), "triton_mla_prefill"),  # ragged batch
        (dict(q_lens=[30], kv_lens=[40]), "triton_mla_prefill"),  # cached prefix
        (dict(q_lens=[40], kv_lens=[40], return_lse=True), "triton_mla_prefill"),
        (dict(q_lens=[40], kv_lens=[40], dtype=torch.float32), "triton_mla_prefill"),
    ],
)
def test_gpu_dispatch_by_shape_traits(case, expected):
    signature, traits = _traits(**case)
    assert explain_selection("mla", "prefill", signature, traits=traits, device=H200).chosen == (
        expected
    )
    assert explain_selection("mla", "prefill", signature, traits=traits, device=A100).chosen == (
        expected
    )
    on_cpu = explain_selection("mla", "prefill", signature, traits=traits, device="cpu")
    assert on_cpu.chosen == "torch_mla_prefill"


def test_prefix_trait_comes_from_shapes_only():
    from tokenspeed.mla.ops import prefill_prefix_trait

    assert prefill_prefix_trait(100, 100) == "none"
    assert prefill_prefix_trait(100, 164) == "any"


@needs_triton
def test_explicit_triton_override_still_wins_for_a_dense_request():
    q, k, v = _dense(torch.float32, tokens=20)
    lens = [20]
    with kernel_override("mla.prefill", "triton"):
        out = M.mla_prefill(q, k, v, cu(lens), cu(lens), softmax_scale=0.1)
    assert [r["kernel"] for r in selection_records() if r["op"] == "mla.prefill"][-1] == (
        "triton_mla_prefill"
    )
    exp, _ = prefill64(q, k, v, lens, lens, 0.1, True)
    torch.testing.assert_close(out.double(), exp, **TOL[torch.float32])
