"""Every Triton kernel against the torch reference.

On CPU the kernels run in Triton's interpreter (conftest sets ``TRITON_INTERPRET=1``), at
small float32/float16 shapes (bf16 ``tl.dot`` is wrong in the interpreter). Calls go
through the public ops with an override, so dispatch to the Triton kernels is tested too;
a few tests pass explicit launch configs to reach code paths the defaults skip (several
KV splits, the two-pass norm, tiny GEMM blocks).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from kernel_cases import cos_sin_cache, paged_kv

import tokenspeed.kernels as K
from tokenspeed.kernels import kernel_override, selection_records
from tokenspeed.kernels.device import triton_available
from tokenspeed.kernels.reference import activation as ref_act
from tokenspeed.kernels.reference import attention as ref_attn
from tokenspeed.kernels.reference import kv_cache as ref_kv
from tokenspeed.kernels.reference import moe as ref_moe
from tokenspeed.kernels.reference import norm as ref_norm
from tokenspeed.kernels.reference import rotary as ref_rot

pytestmark = pytest.mark.skipif(not triton_available(), reason="triton is not installed")

DTYPES = [torch.float32, torch.float16]
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=4e-3, rtol=4e-3)}
ALL_TRITON = {
    "norm.rms": "triton",
    "norm.fused_add_rms": "triton",
    "rotary.apply": "triton",
    "activation.silu_and_mul": "triton",
    "kv_cache.store": "triton",
    "attention.decode": "triton",
    "attention.extend": "triton",
    "moe.route": "triton",
    "moe.experts": "triton",
}


def close(actual, expected, dtype, scale: float = 1.0):
    tol = {k: v * scale for k, v in TOL[dtype].items()}
    torch.testing.assert_close(actual.float(), expected.float(), **tol)


def used_kernel(op: str) -> str:
    return [r["kernel"] for r in selection_records() if r["op"] == op][-1]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 300])
def test_rms_norms(device, dtype, hidden):
    x = torch.randn(9, hidden, device=device).to(dtype)
    res = torch.randn(9, hidden, device=device).to(dtype)
    w = torch.randn(hidden, device=device).to(dtype)
    with kernel_override(ALL_TRITON):
        out = K.rms_norm(x, w, 1e-6)
        normed, res_out = K.fused_add_rms_norm(x, res, w, 1e-6)
    assert used_kernel("norm.rms") == "triton_rms_norm"
    assert used_kernel("norm.fused_add_rms") == "triton_fused_add_rms_norm"
    close(out, ref_norm.rms_norm(x, w, 1e-6), dtype)
    want_normed, want_res = ref_norm.fused_add_rms_norm(x, res, w, 1e-6)
    close(res_out, want_res, dtype)
    close(normed, want_normed, dtype)


def test_rms_norm_two_pass_and_strided_rows(device):
    from tokenspeed.kernels.triton_ops import norm

    base = torch.randn(6, 2 * 200, device=device)
    x = base[:, :200]  # row stride 400: a view, not a copy
    res, w = torch.randn(6, 200, device=device), torch.randn(200, device=device)
    cfg = {"block_rows": 2, "num_warps": 2, "max_block_h": 64}  # 4 column chunks per row
    close(norm.rms_norm(x, w, 1e-5, config=cfg), ref_norm.rms_norm(x, w, 1e-5), torch.float32)
    normed, res_out = norm.fused_add_rms_norm(x, res, w, 1e-5, config=cfg)
    want_normed, want_res = ref_norm.fused_add_rms_norm(x, res, w, 1e-5)
    close(res_out, want_res, torch.float32)
    close(normed, want_normed, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(device, dtype):
    x = torch.randn(7, 2 * 200, device=device).to(dtype)
    with kernel_override("activation.silu_and_mul", "triton_silu_and_mul"):
        out = K.silu_and_mul(x)
    assert used_kernel("activation.silu_and_mul") == "triton_silu_and_mul"
    close(out, ref_act.silu_and_mul(x), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("is_neox", "rot_dim"), [(True, 32), (False, 32), (True, 16), (False, 24)])
def test_rotary(device, dtype, is_neox, rot_dim):
    q = torch.randn(6, 4, 32, device=device).to(dtype)
    k = torch.randn(6, 2, 32, device=device).to(dtype)
    pos = torch.tensor([0, 5, 17, 3, 63, 1], device=device)
    cache = cos_sin_cache(64, rot_dim).to(device)
    want_q, want_k = ref_rot.apply_rotary_emb(q.clone(), k.clone(), pos, cache, is_neox)
    with kernel_override("rotary.apply", "triton"):
        out_q, out_k = K.apply_rotary_emb(q, k, pos, cache, is_neox)
    assert out_q is q and out_k is k
    close(q, want_q, dtype)
    close(k, want_k, dtype)


def test_rotary_on_a_fused_qkv_view(device):
    qkv = torch.randn(5, (4 + 2 + 2) * 16, device=device)
    q = qkv[:, : 4 * 16].view(5, 4, 16)
    k = qkv[:, 4 * 16 : 6 * 16].view(5, 2, 16)
    v_before = qkv[:, 6 * 16 :].clone()
    pos, cache = torch.arange(5, device=device), cos_sin_cache(8, 16).to(device)
    want_q, want_k = ref_rot.apply_rotary_emb(q.clone(), k.clone(), pos, cache, True)
    with kernel_override("rotary.apply", "triton"):
        K.apply_rotary_emb(q, k, pos, cache, True)
    close(q, want_q, torch.float32)
    close(k, want_k, torch.float32)
    assert torch.equal(qkv[:, 6 * 16 :], v_before)  # v untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_store_kv(device, dtype, page_size):
    k_cache = torch.zeros(5, page_size, 2, 32, device=device, dtype=dtype)
    v_cache = torch.zeros(5, page_size, 2, 16, device=device, dtype=dtype)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    slots = torch.tensor([3, -1, 5 * page_size - 1, 0, page_size], device=device)
    k = torch.randn(5, 2, 32, device=device).to(dtype)
    v = torch.randn(5, 2, 16, device=device).to(dtype)
    ref_kv.store_kv(k, v, want_k, want_v, slots)
    with kernel_override("kv_cache.store", "triton"):
        K.store_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_paged_decode(device, dtype, page_size, num_splits):
    from tokenspeed.kernels.triton_ops import decode_attention

    seq_lens = [1, 9, 40, 0, 17]
    k_cache, v_cache, tables, lens = paged_kv(
        seq_lens, 2, 32, page_size, dtype, device, v_head_dim=16
    )
    q = torch.randn(5, 8, 32, device=device).to(dtype)  # GQA group of 4
    want = ref_attn.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.2)
    if num_splits is None:  # the public op with its default config
        with kernel_override("attention.decode", "triton"):
            out = K.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.2)
        assert used_kernel("attention.decode") == "triton_paged_decode"
    else:
        cfg = {"block_n": 16, "num_warps": 4, "num_stages": 1, "num_splits": num_splits}
        out = decode_attention.paged_decode_attention(
            q, k_cache, v_cache, tables, lens, 0.2, config=cfg
        )
    close(out, want, dtype)
    assert torch.all(out[3] == 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("causal", [True, False])
def test_paged_extend(device, dtype, page_size, causal):
    from tokenspeed.kernels.triton_ops import extend_attention

    q_lens, seq_lens = [3, 1, 37, 0, 20], [10, 1, 50, 4, 20]
    k_cache, v_cache, tables, lens = paged_kv(seq_lens, 2, 32, page_size, dtype, device)
    cu = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device=device)
    q = torch.randn(sum(q_lens), 4, 32, device=device).to(dtype)
    want = ref_attn.paged_extend_attention(q, k_cache, v_cache, tables, cu, lens, 0.2, causal)
    cfg = {"block_m": 16, "block_n": 16, "num_warps": 4, "num_stages": 1}
    out = extend_attention.paged_extend_attention(
        q, k_cache, v_cache, tables, cu, lens, 0.2, causal, config=cfg
    )
    close(out, want, dtype)


def test_paged_extend_through_the_op(device):
    k_cache, v_cache, tables, lens = paged_kv([24, 7], 1, 16, 4, torch.float32, device)
    cu = torch.tensor([0, 10, 17], dtype=torch.int32, device=device)
    q = torch.randn(17, 2, 16, device=device)
    want = ref_attn.paged_extend_attention(q, k_cache, v_cache, tables, cu, lens, 0.25)
    with kernel_override("attention.extend", "triton"):
        out = K.paged_extend_attention(q, k_cache, v_cache, tables, cu, lens, 0.25)
    assert used_kernel("attention.extend") == "triton_paged_extend"
    close(out, want, torch.float32)


ROUTES = [
    dict(experts=16, top_k=4, renormalize=True),
    dict(experts=16, top_k=3, renormalize=False, n_group=4, topk_group=2),
    dict(
        experts=64,
        top_k=8,
        scoring="sigmoid",
        renormalize=True,
        bias=True,
        n_group=8,
        topk_group=4,
        routed_scaling_factor=2.5,
    ),
    dict(experts=60, top_k=6, scoring="sigmoid", renormalize=False, bias=True),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(ROUTES)))
def test_moe_route(device, dtype, case):
    kw = dict(ROUTES[case])
    experts = kw.pop("experts")
    if kw.pop("bias", False):
        kw["correction_bias"] = torch.randn(experts, device=device) * 0.3
    logits = torch.randn(13, experts, device=device).to(dtype)
    want_w, want_ids = ref_moe.moe_route(logits, **kw)
    with kernel_override("moe.route", "triton"):
        w, ids = K.moe_route(logits, **kw)
    assert used_kernel("moe.route") == "triton_moe_route"
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(w, want_w, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "top_k", "experts"), [(1, 2, 8), (13, 3, 6), (40, 2, 4)])
def test_fused_moe(device, dtype, tokens, top_k, experts):
    from tokenspeed.kernels.triton_ops import fused_moe

    hidden, inter = 40, 24
    x = torch.randn(tokens, hidden, device=device).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, device=device) / hidden**0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, device=device) / inter**0.5).to(dtype)
    weights, ids = ref_moe.moe_route(
        torch.randn(tokens, experts, device=device), top_k, renormalize=True
    )
    want = ref_moe.fused_moe(x, w13, w2, weights, ids)
    cfg = {"block_m": 16, "block_n": 16, "block_k": 16, "num_warps": 4, "num_stages": 1}
    out = fused_moe.fused_moe(x, w13, w2, weights, ids, config=cfg)
    close(out, want, dtype, scale=2.0)  # float16 rounds the intermediate activation


def test_fused_moe_through_the_op_with_default_config(device):
    tokens, hidden, inter, experts = 5, 32, 16, 4
    x = torch.randn(tokens, hidden, device=device)
    w13 = torch.randn(experts, 2 * inter, hidden, device=device) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, device=device) / inter**0.5
    weights, ids = ref_moe.moe_route(
        torch.randn(tokens, experts, device=device), 2, renormalize=False
    )
    with kernel_override("moe.experts", "triton"):
        out = K.fused_moe(x, w13, w2, weights, ids)
    assert used_kernel("moe.experts") == "triton_fused_moe"
    close(out, ref_moe.fused_moe(x, w13, w2, weights, ids), torch.float32)


def test_align_by_expert_blocks_hold_one_expert_each():
    from tokenspeed.kernels.triton_ops.fused_moe import align_by_expert

    ids = torch.tensor([[2, 0], [2, 1], [2, 0]])
    sorted_ids, block_expert = align_by_expert(ids, num_experts=4, block_m=2)
    flat = ids.reshape(-1)
    pairs = flat.numel()
    seen = []
    for blk, expert in enumerate(block_expert.tolist()):
        rows = sorted_ids[blk * 2 : blk * 2 + 2].tolist()
        real = [r for r in rows if r < pairs]
        if expert >= 4:
            assert not real
            continue
        assert real and all(int(flat[r]) == expert for r in real)
        seen += real
    assert sorted(seen) == list(range(pairs))
