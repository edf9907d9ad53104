"""Every MLA Triton kernel against float64 math, in Triton's interpreter on CPU.

Small float32/float16 shapes (bf16 ``tl.dot`` is wrong in the interpreter). Calls go through
the public ops with an override, so dispatch to the Triton kernels is tested too. Outputs
are pre-filled with NaN: a row the kernel forgets to write fails the comparison.
"""

from __future__ import annotations

import pytest
import torch
from mla_float64 import cu, decode64, paged_latent, prefill64

import tokenspeed.mla as M
from tokenspeed.kernels import kernel_override, selection_records
from tokenspeed.kernels.device import triton_available

pytestmark = pytest.mark.skipif(not triton_available(), reason="triton is not installed")

TOL = {torch.float32: dict(atol=3e-5, rtol=3e-5), torch.float16: dict(atol=1.5e-2, rtol=1.5e-2)}
FP8 = torch.float8_e4m3fn


def _used(op: str) -> str:
    return [r["kernel"] for r in selection_records() if r["op"] == op][-1]


def _decode(q, cache, tables, seq, rank, *, kv_scale=None, **kwargs):
    out = torch.full((*q.shape[:3], rank), float("nan"), dtype=q.dtype)
    with kernel_override("mla.decode", "triton"):
        res, lse = M.mla_decode(
            q, cache, tables, torch.tensor(seq, dtype=torch.int32), 0.25, out=out,
            return_lse=True, kv_scale=kv_scale, kv_lora_rank=rank, **kwargs,
        )  # fmt: skip
    assert res is out
    assert _used("mla.decode").startswith("triton_mla_decode")
    return res, lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("q_len", [1, 2, 3, 4])
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_causal_block_splits_pages(dtype, page_size, q_len, splits):
    rank, rope, heads = 64, 32, 8
    seq = [q_len, 45, 70]
    cache, tables = paged_latent(seq, page_size, rank + rope, dtype, seed=page_size + q_len)
    q = torch.randn(len(seq), q_len, heads, rank + rope).to(dtype)
    out, lse = _decode(q, cache, tables, seq, rank, num_splits=splits)
    exp, exp_lse = decode64(q, cache, tables, seq, 0.25, rank)
    torch.testing.assert_close(out.double(), exp, **TOL[dtype])
    torch.testing.assert_close(lse.double(), exp_lse, **TOL[dtype])


@pytest.mark.parametrize("q_len", [1, 3])
def test_decode_reads_strided_lengths_and_tables(q_len):
    """A speculative batch hands the op per-request views of its per-row metadata (every
    ``q_len``-th table, the last length of each block): strided, yet read by request."""
    rank, rope, heads = 32, 16, 4
    seq = [q_len + 2, 45, 70]
    cache, tables = paged_latent(seq, 16, rank + rope, torch.float32, seed=7)
    rows_tables = tables.repeat_interleave(q_len, 0)  # one row per query token, as the runtime
    rows_lens = torch.tensor(seq, dtype=torch.int32).repeat_interleave(q_len)
    rows_lens += torch.arange(len(seq) * q_len, dtype=torch.int32) % q_len - (q_len - 1)
    q = torch.randn(len(seq), q_len, heads, rank + rope)
    with kernel_override("mla.decode", "triton"):
        out = M.mla_decode(
            q, cache, rows_tables[::q_len], rows_lens[q_len - 1 :: q_len], 0.25, kv_lora_rank=rank
        )  # fmt: skip
    exp, _ = decode64(q, cache, tables, seq, 0.25, rank)
    torch.testing.assert_close(out.double(), exp, **TOL[torch.float32])


@pytest.mark.parametrize(
    "heads,q_len,fold",
    [(16, 4, None), (16, 4, 1), (16, 4, 2), (40, 3, None), (4, 2, 2), (24, 2, 1)],
)
def test_decode_folding(heads, q_len, fold):
    rank, rope = 32, 16
    seq = [9, 30]
    cache, tables = paged_latent(seq, 4, rank + rope, torch.float32, seed=heads)
    q = torch.randn(len(seq), q_len, heads, rank + rope)
    plan = None
    with kernel_override("mla.decode", "triton"):
        plan = M.mla_decode_plan(q, cache, tables, fold_sq_factor=fold, kv_lora_rank=rank)
    assert plan.fold_sq_factor == (fold or M.configs.fold_factor(heads, q_len))
    out, lse = _decode(q, cache, tables, seq, rank, fold_sq_factor=fold, num_splits=2)
    exp, exp_lse = decode64(q, cache, tables, seq, 0.25, rank)
    torch.testing.assert_close(out.double(), exp, **TOL[torch.float32])
    torch.testing.assert_close(lse.double(), exp_lse, **TOL[torch.float32])


def test_decode_full_latent_dims_with_workspace_and_empty_request():
    """DeepSeek dims (512 + 64), an empty (padding) request, a caller-owned workspace."""
    seq = [0, 200, 3]
    cache, tables = paged_latent(seq, 16, 576, torch.float32, seed=7)
    q = torch.randn(3, 2, 16, 576) * 0.2
    with kernel_override("mla.decode", "triton"):
        plan = M.mla_decode_plan(q, cache, tables, num_splits=4)
    assert plan.num_splits == 4
    assert plan.workspace_bytes == 3 * 2 * 16 * 4 * 513 * 4
    workspace = torch.full((plan.workspace_bytes + 64,), 255, dtype=torch.uint8)
    out, lse = _decode(q, cache, tables, seq, 512, num_splits=4, workspace=workspace)
    exp, exp_lse = decode64(q, cache, tables, seq, 0.25, 512)
    assert torch.all(out[0] == 0) and torch.all(lse[0] == float("-inf"))
    torch.testing.assert_close(out.double(), exp, **TOL[torch.float32])
    torch.testing.assert_close(lse[1:].double(), exp_lse[1:], **TOL[torch.float32])
    with pytest.raises(ValueError, match="workspace"):
        _decode(q, cache, tables, seq, 512, num_splits=4, workspace=workspace[:100])


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("splits", [1, 2])
def test_decode_fp8_cache(per_token, splits):
    rank, rope, heads, page = 64, 32, 8, 16
    seq = [17, 60]
    real, tables = paged_latent(seq, page, rank + rope, torch.float32, seed=3)
    if per_token:
        scale = (real.abs().amax(-1) / 448).clamp_min(1e-12)
        fp8 = (real / scale[..., None]).to(FP8)
    else:
        scale = torch.tensor([real.abs().max().item() / 448])
        fp8 = (real / scale).to(FP8)
    q = torch.randn(2, 2, heads, rank + rope)
    out, lse = _decode(q, fp8, tables, seq, rank, kv_scale=scale, num_splits=splits)
    assert _used("mla.decode") == "triton_mla_decode_fp8"
    exp, exp_lse = decode64(q, fp8.float(), tables, seq, 0.25, rank, kv_scale=scale)
    torch.testing.assert_close(out.double(), exp, **TOL[torch.float32])
    torch.testing.assert_close(lse.double(), exp_lse, **TOL[torch.float32])


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("magnitude", [1e-5, 1.0, 20.0])
@pytest.mark.parametrize("layout", ["rows_on_m", "tokens_on_m", "rows_on_m_tma"])
@pytest.mark.parametrize("q_dtype", [torch.float16, torch.bfloat16])
def test_decode_fp8_cache_f16_products(q_dtype, per_token, magnitude, layout, monkeypatch):
    """A 16-bit query over an FP8 cache multiplies in f16 (a bf16 query scaled into f16's
    range by the launcher, with values past its 65504; per-token scales taken relative to the
    largest seen): caches far below f16's normal range and near its top keep f16's
    precision, with splits and an empty request."""
    from tokenspeed.mla import triton_decode

    if layout.endswith("tma"):
        monkeypatch.setattr(triton_decode, "_tma_ok", lambda *args: True)
    rank, rope, heads, page = 64, 32, 8, 16
    seq = [17, 0, 60]
    real, tables = paged_latent(seq, page, rank + rope, torch.float32, seed=5)
    # per-token magnitudes spread over 2^8 so the running largest scale moves along a request
    real = real * magnitude * torch.exp2(torch.randint(0, 9, real.shape[:2]).float())[..., None]
    if per_token:
        scale = (real.abs().amax(-1) / 448).clamp_min(1e-30)
        fp8 = (real / scale[..., None]).to(FP8)
    else:
        scale = torch.tensor([real.abs().max().item() / 448])
        fp8 = (real / scale).to(FP8)
    q = torch.randn(3, 2, heads, rank + rope) * 3
    softmax_scale = 0.25
    if q_dtype == torch.bfloat16:  # past f16's range, the softmax scale compensating
        q, softmax_scale = q * 2e4, softmax_scale / 2e4
    q = q.to(q_dtype)
    out = torch.full((*q.shape[:3], rank), float("nan"), dtype=q_dtype)
    res, lse = triton_decode.mla_decode(
        q, fp8, tables, torch.tensor(seq, dtype=torch.int32), softmax_scale, out=out,
        return_lse=True,
        kv_scale=scale, kv_lora_rank=rank, num_splits=2,
        config={"tokens_on_m": int(layout.startswith("tokens")), "tma": int(layout.endswith("tma")),
                "block_h": 16, "block_n": 16, "num_warps": 4, "num_stages": 1},
    )  # fmt: skip
    exp, exp_lse = decode64(q, fp8.float(), tables, seq, softmax_scale, rank, kv_scale=scale)
    unit = float(exp.abs().max())
    assert torch.all(res[1] == 0) and torch.all(lse[1] == float("-inf"))
    # f16 products and output: ~4e-4 of the largest output; with the bf16 query's logits of
    # ~10 the f16 rounding of the query moves them by ~5e-3, and a bf16 output rounds 8x coarser
    atol = 1e-3 if q_dtype == torch.float16 else 1e-2
    torch.testing.assert_close(res.double() / unit, exp / unit, atol=atol, rtol=0)
    keep = [0, 2]
    torch.testing.assert_close(lse[keep].double(), exp_lse[keep], atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block", [(16, 16), (32, 16)])
def test_prefill(dtype, causal, block):
    q_lens, kv_lens = [1, 37, 20, 5], [1, 37, 61, 5 + 33]  # no prefix, prefix 24 and 33
    heads, heads_kv, d_qk, d_v = 4, 2, 48, 32  # 48 = 32 + 16: the split q/k dim path
    q = torch.randn(sum(q_lens), heads, d_qk).to(dtype)
    k = torch.randn(sum(kv_lens), heads_kv, d_qk).to(dtype)
    v = torch.randn(sum(kv_lens), heads_kv, d_v).to(dtype)
    out = torch.full((sum(q_lens), heads, d_v), float("nan"), dtype=dtype)
    from tokenspeed.mla import triton_prefill

    res, lse = triton_prefill.mla_prefill(
        q, k, v, cu(q_lens), cu(kv_lens), softmax_scale=0.2, causal=causal, return_lse=True,
        out=out, max_seqlen_q=max(q_lens) if block[0] == 16 else None,
        config={"block_m": block[0], "block_n": block[1], "num_warps": 4, "num_stages": 1},
    )  # fmt: skip
    exp, exp_lse = prefill64(q, k, v, q_lens, kv_lens, 0.2, causal)
    assert res is out
    torch.testing.assert_close(out.double(), exp, **TOL[dtype])
    torch.testing.assert_close(lse.double(), exp_lse, **TOL[dtype])


def test_prefill_dispatch_power_of_two_dim():
    q_lens = kv_lens = [7, 3]
    q, k, v = torch.randn(10, 2, 32), torch.randn(10, 2, 32), torch.randn(10, 2, 16)
    with kernel_override("mla.prefill", "triton"):
        out = M.mla_prefill(q, k, v, cu(q_lens), cu(kv_lens), softmax_scale=0.3)
    assert _used("mla.prefill") == "triton_mla_prefill"
    exp, _ = prefill64(q, k, v, q_lens, kv_lens, 0.3, True)
    torch.testing.assert_close(out.double(), exp, **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kv_pack_strided(dtype):
    proj = torch.randn(11, 100).to(dtype)  # kv_c and k_pe as views of one projection
    kv_c, k_pe = proj[:, :64], proj[:, 80:96]
    with kernel_override("mla.kv_pack", "triton"):
        packed = M.mla_kv_pack(kv_c, k_pe)
    assert torch.equal(packed, torch.cat((kv_c, k_pe), -1))


@pytest.mark.parametrize("static", [False, True])
def test_kv_pack_quantize_fp8_matches_reference(static):
    gen = torch.Generator().manual_seed(1)
    kv_c = torch.randn(13, 512, generator=gen) * torch.logspace(-3, 1, 13)[:, None]
    k_pe = torch.randn(13, 64, generator=gen)
    scale = torch.tensor([0.01]) if static else None
    out = torch.empty(13, 576, dtype=FP8)
    with kernel_override("mla.kv_pack_fp8", "triton"):
        q, s = M.mla_kv_pack_quantize_fp8(kv_c, k_pe, scale=scale, out=out)
    assert q is out
    ref_q, ref_s = M.reference.mla_kv_pack_quantize_fp8(kv_c, k_pe, scale=scale)
    torch.testing.assert_close(s, ref_s, atol=0, rtol=1e-6)
    assert torch.equal(q.float(), ref_q.float())  # same rounding (nearest, ties to even)
    packed = torch.cat((kv_c, k_pe), -1)
    deq = q.float() * (s if static else s[:, None])
    bound = packed.abs() * 2**-4 + (s if static else s[:, None]) * 2**-10
    saturated = (packed / (s if static else s[:, None])).abs() > 448
    assert torch.all(((deq - packed).abs() <= bound) | saturated)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16, "fp8_tensor", "fp8_token"])
def test_store_kv(cache_dtype):
    pages, page, tokens = 4, 16, 9
    kv_c, k_pe = torch.randn(tokens, 64), torch.randn(tokens, 32)
    slots = torch.tensor([3, 17, -1, 40, 63, -1, 0, 22, 50])
    dtype = FP8 if isinstance(cache_dtype, str) else cache_dtype
    scale = None
    if cache_dtype == "fp8_tensor":
        scale = torch.tensor([0.02])
    elif cache_dtype == "fp8_token":
        scale = torch.full((pages, page), -1.0)
    caches = []
    for kernel in ("triton", "torch"):
        cache = torch.zeros(pages, page, 96, dtype=dtype)
        sc = scale.clone() if scale is not None and scale.numel() > 1 else scale
        with kernel_override("mla.store_kv", kernel):
            M.mla_store_kv(kv_c.to(torch.float16 if dtype == torch.float16 else torch.float32),
                           k_pe, cache, slots, kv_scale=sc)  # fmt: skip
        caches.append((cache.float(), sc))
    (tri, tri_s), (ref, ref_s) = caches
    assert torch.equal(tri, ref)
    if cache_dtype == "fp8_token":
        torch.testing.assert_close(tri_s, ref_s, atol=0, rtol=1e-6)
    written = slots[slots >= 0]
    untouched = torch.ones(pages * page, dtype=torch.bool)
    untouched[written] = False
    assert torch.all(tri.view(-1, 96)[untouched] == 0)


def test_decode_launch_variants():
    """Configs the tuner may pick: q re-read inside the loop, 32-row blocks, 1 stage."""
    from tokenspeed.mla import triton_decode

    rank, rope, heads, q_len = 64, 32, 24, 2
    seq = [3, 41]
    cache, tables = paged_latent(seq, 16, rank + rope, torch.float32, seed=9)
    q = torch.randn(2, q_len, heads, rank + rope)
    exp, _ = decode64(q, cache, tables, seq, 0.25, rank)
    for cfg in (
        {"block_h": 16, "block_n": 16, "num_warps": 4, "num_stages": 1, "num_splits": 2,
         "q_reload": 1},
        {"block_h": 32, "block_n": 32, "num_warps": 4, "num_stages": 1, "num_splits": 1,
         "q_reload": 0},
    ):  # fmt: skip
        out = triton_decode.mla_decode(
            q, cache, tables, torch.tensor(seq, dtype=torch.int32), 0.25, kv_lora_rank=rank,
            config=cfg,
        )  # fmt: skip
        torch.testing.assert_close(out.double(), exp, **TOL[torch.float32])


@pytest.mark.parametrize("cache_kind", ["float32", "fp8_tensor", "fp8_token"])
@pytest.mark.parametrize("q_len,splits", [(1, 1), (3, 3), (4, 2)])
@pytest.mark.parametrize("layout", ["tokens_on_m", "tokens_on_m_tma", "rows_on_m_tma"])
def test_decode_layouts(cache_kind, q_len, splits, layout, monkeypatch):
    """The transposed products (KV tokens on M) and the TMA program (whole tiles through
    tensor descriptors, the split's partial tail by masked loads; forced here, the
    interpreter has no compute capability): causal query blocks, row blocks that cut a
    group, split KV with an empty request, both FP8 scalings, LSE, every row written."""
    from tokenspeed.mla import triton_decode

    if layout.endswith("tma"):
        monkeypatch.setattr(triton_decode, "_tma_ok", lambda *args: True)
    rank, rope, heads = 64, 32, 24
    seq = [q_len, 45, 0, 70]
    cache, tables = paged_latent(seq, 16, rank + rope, torch.float32, seed=q_len + splits)
    scale = None
    if cache_kind == "fp8_token":
        scale = (cache.abs().amax(-1) / 448).clamp_min(1e-12)
        cache = (cache / scale[..., None]).to(FP8)
    elif cache_kind == "fp8_tensor":
        scale = torch.tensor([cache.abs().max().item() / 448])
        cache = (cache / scale).to(FP8)
    q = torch.randn(len(seq), q_len, heads, rank + rope)
    out = torch.full((*q.shape[:3], rank), float("nan"))
    res, lse = triton_decode.mla_decode(
        q, cache, tables, torch.tensor(seq, dtype=torch.int32), 0.25, out=out, return_lse=True,
        kv_scale=scale, kv_lora_rank=rank, num_splits=splits,
        config={"tokens_on_m": int(layout.startswith("tokens")), "tma": int(layout.endswith("tma")),
                "block_h": 16, "block_n": 16, "num_warps": 4, "num_stages": 1},
    )  # fmt: skip
    exp, exp_lse = decode64(q, cache.float(), tables, seq, 0.25, rank, kv_scale=scale)
    torch.testing.assert_close(res.double(), exp, **TOL[torch.float32])
    assert torch.all(lse[2] == float("-inf"))
    keep = [0, 1, 3]
    torch.testing.assert_close(lse[keep].double(), exp_lse[keep], **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_tiny_dims_pad_to_a_dot_of_16(dtype):
    """A tiny model's rope dim 8 (decode) and q/k dim 16 + 8 (prefill) pad to K = 16."""
    from tokenspeed.mla import triton_decode, triton_prefill

    rank, rope, heads = 32, 8, 4
    seq = [5, 40]
    cache, tables = paged_latent(seq, 16, rank + rope, dtype, seed=2)
    q = torch.randn(2, 1, heads, rank + rope).to(dtype)
    out = triton_decode.mla_decode(q, cache, tables, torch.tensor(seq, dtype=torch.int32), 0.25,
                                   kv_lora_rank=rank, num_splits=2)  # fmt: skip
    exp, _ = decode64(q, cache, tables, seq, 0.25, rank)
    torch.testing.assert_close(out.double(), exp, **TOL[dtype])

    q_lens, kv_lens = [3, 20], [7, 20]
    qp, kp = torch.randn(23, heads, 24).to(dtype), torch.randn(27, heads, 24).to(dtype)
    vp = torch.randn(27, heads, 16).to(dtype)
    res = triton_prefill.mla_prefill(
        qp, kp, vp, cu(q_lens), cu(kv_lens), softmax_scale=0.3,
        config={"block_m": 16, "block_n": 16, "num_warps": 4, "num_stages": 1},
    )  # fmt: skip
    exp_p, _ = prefill64(qp, kp, vp, q_lens, kv_lens, 0.3, True)
    torch.testing.assert_close(res.double(), exp_p, **TOL[dtype])
