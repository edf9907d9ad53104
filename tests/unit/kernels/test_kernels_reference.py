"""The torch references against textbook float64 math, in every dtype the engine uses."""

from __future__ import annotations

import kernel_float64_math as f64
import pytest
import torch
from kernel_cases import TOLERANCE, cos_sin_cache, paged_kv

from tokenspeed.kernels import (
    apply_rotary_emb,
    fused_add_rms_norm,
    fused_moe,
    moe_route,
    paged_decode_attention,
    paged_extend_attention,
    rms_norm,
    selection_records,
    silu_and_mul,
    store_kv,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(actual.double(), expected.double(), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_float64(dtype):
    x = torch.randn(7, 48).to(dtype)
    w = torch.randn(48).to(dtype)
    out = rms_norm(x, w, 1e-6)
    assert out.dtype == dtype and out.shape == x.shape
    close(out, f64.rms_norm(x, w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_matches_float64(dtype):
    x, res = torch.randn(5, 32).to(dtype), torch.randn(5, 32).to(dtype)
    w = torch.randn(32).to(dtype)
    normed, residual_out = fused_add_rms_norm(x, res, w, 1e-5)
    close(residual_out, x.double() + res.double(), dtype)
    close(normed, f64.rms_norm(residual_out, w, 1e-5), dtype)
    assert residual_out.dtype == dtype and normed.dtype == dtype


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_float64(dtype):
    x = torch.randn(6, 40).to(dtype)
    out = silu_and_mul(x)
    assert out.shape == (6, 20)
    close(out, f64.silu_and_mul(x), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rot_dim", [16, 8])
def test_rotary_in_place_matches_float64(dtype, is_neox, rot_dim):
    q, k = torch.randn(5, 4, 16).to(dtype), torch.randn(5, 2, 16).to(dtype)
    positions = torch.tensor([0, 3, 7, 2, 31])
    cache = cos_sin_cache(32, rot_dim)
    want_q = f64.rotary(q, positions, cache, is_neox)
    want_k = f64.rotary(k, positions, cache, is_neox)
    q_ptr = q.data_ptr()
    out_q, out_k = apply_rotary_emb(q, k, positions, cache, is_neox)
    assert out_q.data_ptr() == q_ptr and out_q is q and out_k is k  # in place
    close(q, want_q, dtype)
    close(k, want_k, dtype)


def test_rotary_position_zero_is_identity():
    q, k = torch.randn(1, 2, 8), torch.randn(1, 2, 8)
    q0, k0 = q.clone(), k.clone()
    apply_rotary_emb(q, k, torch.tensor([0]), cos_sin_cache(4, 8), True)
    torch.testing.assert_close(q, q0)
    torch.testing.assert_close(k, k0)


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_store_kv_writes_slots_and_skips_padding(page_size):
    k_cache = torch.zeros(4, page_size, 2, 8)
    v_cache = torch.zeros(4, page_size, 2, 6)
    slots = torch.tensor([0, 4 * page_size - 1, -1, page_size + 0])
    k, v = torch.randn(4, 2, 8), torch.randn(4, 2, 6)
    store_kv(k, v, k_cache, v_cache, slots)
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        torch.testing.assert_close(k_cache[slot // page_size, slot % page_size], k[t])
        torch.testing.assert_close(v_cache[slot // page_size, slot % page_size], v[t])
    assert int((k_cache != 0).any(dim=(2, 3)).sum()) == 3  # exactly three slots written


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_paged_decode_matches_float64(dtype, page_size):
    seq_lens = [1, 9, 20, 0]
    k_cache, v_cache, tables, lens = paged_kv(seq_lens, 2, 16, page_size, dtype, v_head_dim=8)
    q = torch.randn(4, 6, 16).to(dtype)
    out = paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.3)
    assert out.shape == (4, 6, 8) and out.dtype == dtype
    close(out, f64.decode(q, k_cache, v_cache, tables, lens, 0.3), dtype)
    assert torch.all(out[3] == 0)  # an empty request reads nothing


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("causal", [True, False])
def test_paged_extend_matches_float64(dtype, page_size, causal):
    q_lens, seq_lens = [3, 1, 6, 0], [10, 1, 6, 4]  # cached prefixes 7, 0, 0, 4
    k_cache, v_cache, tables, lens = paged_kv(seq_lens, 2, 16, page_size, dtype)
    cu = torch.tensor([0, 3, 4, 10, 10], dtype=torch.int32)
    q = torch.randn(sum(q_lens), 4, 16).to(dtype)
    out = paged_extend_attention(q, k_cache, v_cache, tables, cu, lens, 0.25, causal)
    assert out.shape == (10, 4, 16) and out.dtype == dtype
    close(out, f64.extend(q, k_cache, v_cache, tables, cu, lens, 0.25, causal), dtype)


@pytest.mark.parametrize("group", [1, 2, 4])
def test_paged_decode_matches_dense_oracle_at_model_shapes(group):
    """A tiny-model-sized batch (64 requests, up to 640 tokens, pages of 16) in float32."""
    gen = torch.Generator().manual_seed(group)
    seq_lens = torch.randint(1, 641, (64,), generator=gen).tolist()
    seq_lens[5] = 0
    k_cache, v_cache, tables, lens = paged_kv(seq_lens, 2, 32, 16, torch.float32)
    qkv = torch.randn(64, 3 * 2 * group, 32, generator=gen)
    q = qkv[:, : 2 * group]  # a non-contiguous slice, as the model passes it
    out = paged_decode_attention(q, k_cache, v_cache, tables, lens, 32**-0.5)
    want = f64.decode_dense(q, k_cache, v_cache, tables, lens, 32**-0.5)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    assert torch.all(out[5] == 0)


@pytest.mark.parametrize("causal", [True, False])
def test_paged_extend_matches_dense_oracle_at_model_shapes(causal):
    gen = torch.Generator().manual_seed(1)
    q_lens = [40, 1, 0, 200, 17, 33]
    seq_lens = [40, 130, 9, 200, 100, 33]  # cached prefixes 0, 129, 9, 0, 83, 0
    k_cache, v_cache, tables, lens = paged_kv(seq_lens, 2, 32, 16, torch.float32)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(q_lens), 4, 32, generator=gen)
    out = paged_extend_attention(q, k_cache, v_cache, tables, cu, lens, 0.2, causal)
    want = f64.extend_dense(q, k_cache, v_cache, tables, cu, lens, 0.2, causal)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


def _check_route(logits, top_k, **kw):
    weights, ids = moe_route(logits, top_k, **kw)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    want = f64.moe_route(
        logits,
        top_k,
        kw.get("scoring", "softmax"),
        kw["renormalize"],
        kw.get("correction_bias"),
        kw.get("n_group"),
        kw.get("topk_group"),
        kw.get("routed_scaling_factor", 1.0),
    )
    for t, pairs in enumerate(want):
        assert ids[t].tolist() == [e for e, _ in pairs]
        torch.testing.assert_close(
            weights[t].double(),
            torch.tensor([w for _, w in pairs], dtype=torch.float64),
            atol=1e-6,
            rtol=1e-5,
        )


@pytest.mark.parametrize("renormalize", [True, False])
def test_moe_route_softmax(renormalize):
    _check_route(torch.randn(9, 16), 4, renormalize=renormalize)


def test_moe_route_softmax_grouped():
    _check_route(torch.randn(9, 16), 3, renormalize=False, n_group=4, topk_group=2)


def test_moe_route_sigmoid_bias_groups_deepseek_style():
    logits, bias = torch.randn(11, 32), torch.randn(32) * 0.5
    kw = dict(
        scoring="sigmoid",
        renormalize=True,
        correction_bias=bias,
        n_group=8,
        topk_group=4,
        routed_scaling_factor=2.5,
    )
    _check_route(logits, 8, **kw)
    weights, _ = moe_route(logits, 8, **kw)
    torch.testing.assert_close(weights.sum(-1), torch.full((11,), 2.5))


def test_moe_route_bias_picks_but_does_not_weigh():
    logits = torch.zeros(1, 4)
    bias = torch.tensor([0.0, 0.0, 5.0, 0.0])
    weights, ids = moe_route(logits, 1, scoring="sigmoid", renormalize=False, correction_bias=bias)
    assert ids.tolist() == [[2]]
    torch.testing.assert_close(weights, torch.full((1, 1), 0.5))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_moe_matches_float64(dtype):
    tokens, hidden, inter, experts, top_k = 7, 32, 24, 6, 2
    x = torch.randn(tokens, hidden).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden) / hidden**0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter) / inter**0.5).to(dtype)
    weights, ids = moe_route(torch.randn(tokens, experts), top_k, renormalize=True)
    out = fused_moe(x, w13, w2, weights, ids)
    assert out.shape == x.shape and out.dtype == dtype
    close(out, f64.fused_moe(x, w13, w2, weights, ids), dtype)


def test_ops_record_their_selection():
    rms_norm(torch.randn(3, 16), torch.ones(16), 1e-6)
    records = [r for r in selection_records() if r["op"] == "norm.rms"]
    assert len(records) == 1
    assert records[0]["kernel"] == "torch_rms_norm"
    assert "hidden=16" in records[0]["bucket"] and "num_tokens=4" in records[0]["bucket"]
