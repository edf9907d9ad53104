"""MLA Triton kernels on a real GPU: bf16 and FP8 at FlashMLA's shapes against the reference.

Skipped without CUDA, and when ``TRITON_INTERPRET=1`` is set (then Triton would interpret
instead of compiling; run this file in its own process).
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from tokenspeed.mla.configs import PREFILL_VARIANTS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") == "1", reason="Triton interpreter is on"
    ),
]

FP8 = torch.float8_e4m3fn
SCALE = 1 / math.sqrt(192)


def _fp8_ok() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def _decode_problem(batch, heads, q_len, kv_len, page, *, ragged=False, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    lens = torch.full((batch,), kv_len, dtype=torch.int32, device="cuda")
    if ragged:
        lens = torch.randint(q_len, kv_len + 1, (batch,), generator=gen, device="cuda").int()
    pages_per = -(-kv_len // page)
    total = batch * pages_per + 3
    perm = torch.randperm(total, generator=gen, device="cuda")[: batch * pages_per]
    tables = perm.view(batch, pages_per).int()
    cache = (torch.randn(total, page, 576, generator=gen, device="cuda") * 0.5).bfloat16()
    q = (torch.randn(batch, q_len, heads, 576, generator=gen, device="cuda") * 0.5).bfloat16()
    return q, cache, tables, lens


def _store_fp8(cache: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The cache written in e4m3 by ``mla_store_kv``: one scale, or ``[pages, page]`` per-token
    scales that the store fills in."""
    from tokenspeed.mla import mla_store_kv

    flat, quant = cache.view(-1, 576), torch.empty(cache.shape, dtype=FP8, device="cuda")
    slots = torch.arange(flat.shape[0], device="cuda")
    mla_store_kv(flat[:, :512], flat[:, 512:], quant, slots, kv_scale=scale)
    return quant


def _check(actual, expected, atol=2e-2, rtol=2e-2):
    assert not torch.isnan(actual).any()
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol)


@pytest.fixture(autouse=True)
def _triton_everywhere():
    from tokenspeed.kernels import clear_selection_cache, kernel_override

    clear_selection_cache(records=True)
    names = ("mla.decode", "mla.prefill", "mla.kv_pack", "mla.kv_pack_fp8", "mla.store_kv")
    with kernel_override(dict.fromkeys(names, "triton")):
        yield


@pytest.mark.parametrize("q_len", [1, 2])
@pytest.mark.parametrize("heads", [16, 32, 64, 128])
def test_decode_bf16_flashmla_shapes(heads, q_len):
    from tokenspeed.mla import mla_decode, reference

    q, cache, tables, lens = _decode_problem(128, heads, q_len, 4096, 64, seed=heads + q_len)
    out = torch.full((128, q_len, heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    res, lse = mla_decode(q, cache, tables, lens, SCALE, out=out, return_lse=True)
    exp, exp_lse = reference.mla_decode(q, cache, tables, lens, SCALE, return_lse=True)
    _check(res, exp)
    _check(lse, exp_lse, atol=1e-2, rtol=1e-3)


@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("splits", [None, 1, 5])
def test_decode_ragged_pages_splits(page, splits):
    from tokenspeed.mla import mla_decode, reference

    q, cache, tables, lens = _decode_problem(9, 64, 3, 700, page, ragged=True, seed=page)
    lens[0] = 0  # a padded (empty) request: zero output, -inf LSE
    res, lse = mla_decode(q, cache, tables, lens, SCALE, return_lse=True, num_splits=splits)
    exp, exp_lse = reference.mla_decode(q, cache, tables, lens, SCALE, return_lse=True)
    _check(res, exp)
    assert torch.all(lse[0] == float("-inf"))
    _check(lse[1:], exp_lse[1:], atol=1e-2, rtol=1e-3)


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("block_h,block_n,warps", [(16, 32, 4), (32, 16, 4), (64, 32, 8)])
@pytest.mark.parametrize("page,splits", [(1, 5), (64, None)])
def test_decode_tokens_on_m_ragged(block_h, block_n, warps, page, splits, fp8):
    """The transposed Triton decode (KV tokens on M) at every row block it can take, on ragged
    batches with an empty request, bf16 and per-token FP8."""
    from tokenspeed.mla import reference, triton_decode

    if fp8 and not _fp8_ok():
        pytest.skip("FP8 e4m3 needs compute capability >= 8.9")
    q, cache, tables, lens = _decode_problem(9, 40, 2, 700, page, ragged=True, seed=block_h)
    lens[0] = 0
    scale = None
    if fp8:
        scale = torch.empty(cache.shape[:2], dtype=torch.float32, device="cuda")
        cache = _store_fp8(cache, scale)
    cfg = {"tokens_on_m": 1, "block_h": block_h, "block_n": block_n, "num_warps": warps,
           "num_stages": 2}  # fmt: skip
    out = torch.full((9, 2, 40, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    res, lse = triton_decode.mla_decode(q, cache, tables, lens, SCALE, out=out, return_lse=True,
                                        kv_scale=scale, num_splits=splits, config=cfg)  # fmt: skip
    exp, exp_lse = reference.mla_decode(q, cache, tables, lens, SCALE, kv_scale=scale,
                                        return_lse=True)  # fmt: skip
    _check(res, exp)
    assert torch.all(lse[0] == float("-inf"))
    _check(lse[1:], exp_lse[1:], atol=1e-2, rtol=1e-3)


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
    reason="TMA needs compute capability >= 9.0",
)
@pytest.mark.parametrize("cache_kind", ["bf16", "fp8_tensor", "fp8_token"])
@pytest.mark.parametrize(
    "block_h,block_n,warps,tokens_on_m",
    [
        (16, 32, 4, 0),
        (64, 32, 8, 0),
        (64, 64, 8, 0),
        (32, 16, 4, 1),
        (32, 32, 4, 1),
    ],
)
@pytest.mark.parametrize("splits", [None, 1, 5])
def test_decode_tma_ragged(block_h, block_n, warps, tokens_on_m, splits, cache_kind):
    """Whole tiles by TMA, the partial tail of each split by masked loads, rows or KV tokens
    on M: ragged lengths (most end mid-tile), an empty request, pages of 64, bf16 and both
    FP8 scalings. The cache's unused slots hold NaN, which a tail tile must never let into
    the output."""
    from tokenspeed.mla import reference, triton_decode

    q, cache, tables, lens = _decode_problem(9, 40, 2, 700, 64, ragged=True, seed=block_n)
    lens[0] = 0
    used = torch.zeros(cache.shape[:2], dtype=torch.bool, device="cuda")
    for i, n in enumerate(lens.tolist()):
        for j in range(n):
            used[tables[i, j // 64], j % 64] = True
    cache[~used] = float("nan")
    scale = None
    if cache_kind != "bf16":
        per_token = cache_kind == "fp8_token"
        scale = (torch.empty(cache.shape[:2], dtype=torch.float32, device="cuda") if per_token
                 else cache[used].float().abs().amax().reshape(1) / 448)  # fmt: skip
        cache = _store_fp8(cache, scale)
    cfg = {"tma": 1, "tokens_on_m": tokens_on_m, "block_h": block_h, "block_n": block_n,
           "num_warps": warps, "num_stages": 2}  # fmt: skip
    out = torch.full((9, 2, 40, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    res, lse = triton_decode.mla_decode(q, cache, tables, lens, SCALE, out=out, return_lse=True,
                                        kv_scale=scale, num_splits=splits, config=cfg)  # fmt: skip
    # the reference multiplies every slot of a page (by a zero weight past the end): zero them
    ref_cache, ref_scale = cache.clone(), scale
    (ref_cache.view(torch.uint8) if ref_cache.element_size() == 1 else ref_cache)[~used] = 0
    if scale is not None and scale.numel() > 1:
        ref_scale = scale.masked_fill(~used, 0.0)
    exp, exp_lse = reference.mla_decode(q, ref_cache, tables, lens, SCALE, kv_scale=ref_scale,
                                        return_lse=True)  # fmt: skip
    _check(res, exp)
    assert torch.all(lse[0] == float("-inf"))
    _check(lse[1:], exp_lse[1:], atol=1e-2, rtol=1e-3)


@pytest.mark.skipif(not _fp8_ok(), reason="FP8 e4m3 needs compute capability >= 8.9")
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("q_mag", [1e5, 1e-3])
@pytest.mark.parametrize(
    "cfg",
    [
        {"block_h": 16, "block_n": 32, "num_warps": 4, "tma": 0, "tokens_on_m": 0},
        {"block_h": 16, "block_n": 32, "num_warps": 4, "tma": 1, "tokens_on_m": 0},
        {"block_h": 32, "block_n": 32, "num_warps": 4, "tma": 0, "tokens_on_m": 1},
        {"block_h": 64, "block_n": 64, "num_warps": 8, "tma": 1, "tokens_on_m": 0},
    ],
)
def test_decode_fp8_query_range(cfg, q_mag, per_token):
    """Over an FP8 cache the Triton products run in f16 up to 32-row blocks, the query scaled
    into its range (64-row blocks multiply in bf16): query values of 1e5 (past f16's 65504)
    and 1e-3 (near its subnormals) give the same attention as the reference, the softmax
    scale compensating."""
    from tokenspeed.mla import reference, triton_decode

    q, cache, tables, lens = _decode_problem(6, 40, 1, 900, 64, ragged=True, seed=3)
    scale = (torch.empty(cache.shape[:2], dtype=torch.float32, device="cuda") if per_token
             else cache.float().abs().amax().reshape(1) / 448)  # fmt: skip
    fp8 = _store_fp8(cache, scale)
    q = (q.float() * q_mag).bfloat16()
    res = triton_decode.mla_decode(q, fp8, tables, lens, SCALE / q_mag, kv_scale=scale,
                                   num_splits=2, config=dict(cfg, num_stages=2))  # fmt: skip
    exp = reference.mla_decode(q, fp8, tables, lens, SCALE / q_mag, kv_scale=scale)
    _check(res, exp)


@pytest.mark.skipif(not _fp8_ok(), reason="FP8 e4m3 needs compute capability >= 8.9")
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("heads,q_len", [(16, 1), (32, 1), (64, 2), (128, 1)])
def test_decode_fp8_flashmla_shapes(heads, q_len, per_token):
    from tokenspeed.mla import mla_decode, reference

    q, cache, tables, lens = _decode_problem(128, heads, q_len, 4096, 64, seed=heads)
    if per_token:
        scale = torch.empty(cache.shape[:2], dtype=torch.float32, device="cuda")
    else:
        scale = cache.float().abs().amax().reshape(1) / 448
    fp8 = _store_fp8(cache, scale)
    res = mla_decode(q, fp8, tables, lens, SCALE, kv_scale=scale)
    assert res.dtype == torch.bfloat16
    exp = reference.mla_decode(q, fp8, tables, lens, SCALE, kv_scale=scale)
    _check(res, exp)
    # And close to attention over the unquantized cache (FP8 error only).
    unq = reference.mla_decode(q, cache, tables, lens, SCALE)
    _check(res, unq, atol=6e-2, rtol=6e-2)


@pytest.mark.parametrize("causal", [True, False])
def test_prefill_bf16_with_prefix(causal):
    from tokenspeed.mla import mla_prefill, reference

    gen = torch.Generator(device="cuda").manual_seed(1)
    q_lens, kv_lens = [300, 1, 1000, 77], [300, 129, 1800, 77]
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], device="cuda").int()
    cu_k = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], device="cuda").int()
    q = torch.randn(sum(q_lens), 16, 192, generator=gen, device="cuda").bfloat16()
    k = torch.randn(sum(kv_lens), 16, 192, generator=gen, device="cuda").bfloat16()
    v = torch.randn(sum(kv_lens), 16, 128, generator=gen, device="cuda").bfloat16()
    out, lse = mla_prefill(q, k, v, cu_q, cu_k, softmax_scale=SCALE, causal=causal,
                           return_lse=True, max_seqlen_q=1000)  # fmt: skip
    exp, exp_lse = reference.mla_prefill(q, k, v, cu_q, cu_k, softmax_scale=SCALE,
                                         causal=causal, return_lse=True)  # fmt: skip
    _check(out, exp)
    _check(lse, exp_lse, atol=1e-2, rtol=1e-3)


def _ragged_prefill(heads=16, heads_kv=16, seed=2):
    """Ragged bf16 batch with prefixes; V strided out of a [T, H, 256] projection."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q_lens, kv_lens = [300, 1, 1000, 77, 129], [300, 129, 1800, 77, 129]
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], device="cuda").int()
    cu_k = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], device="cuda").int()
    q = torch.randn(sum(q_lens), heads, 192, generator=gen, device="cuda").bfloat16()
    k = torch.randn(sum(kv_lens), heads_kv, 192, generator=gen, device="cuda").bfloat16()
    kv = torch.randn(sum(kv_lens), heads_kv, 256, generator=gen, device="cuda").bfloat16()
    return q, k, kv[..., 128:], cu_q, cu_k, max(q_lens)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("variant", sorted(PREFILL_VARIANTS))
def test_prefill_variants_bf16(variant, causal):
    """Every benchmarked launch variant (cp.async or TMA, 128- or 64-row tiles) on the real compiler."""
    from tokenspeed.mla import configs, reference, triton_prefill

    q, k, v, cu_q, cu_k, max_q = _ragged_prefill(heads_kv=8)
    out = torch.full((q.shape[0], q.shape[1], 128), float("nan"), device="cuda").bfloat16()
    res, lse = triton_prefill.mla_prefill(
        q, k, v, cu_q, cu_k, softmax_scale=SCALE, causal=causal, return_lse=True, out=out,
        max_seqlen_q=max_q, config=configs.PREFILL_VARIANTS[variant],
    )  # fmt: skip
    exp, exp_lse = reference.mla_prefill(q, k, v, cu_q, cu_k, softmax_scale=SCALE,
                                         causal=causal, return_lse=True)  # fmt: skip
    assert res is out
    _check(out, exp)
    _check(lse, exp_lse, atol=1e-2, rtol=1e-3)


@pytest.mark.parametrize("heads_kv", [16, 4])
def test_prefill_sdpa_candidate_one_request(heads_kv):
    """The registry's cuDNN SDPA candidate: one request, no prefix, matches the reference."""
    from tokenspeed.kernels import kernel_override, selection_records
    from tokenspeed.mla import mla_prefill, reference

    gen = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(1500, 16, 192, generator=gen, device="cuda").bfloat16()
    k = torch.randn(1500, heads_kv, 192, generator=gen, device="cuda").bfloat16()
    v = torch.randn(1500, heads_kv, 256, generator=gen, device="cuda").bfloat16()[..., :128]
    cu = torch.tensor([0, 1500], device="cuda").int()
    out = torch.full((1500, 16, 128), float("nan"), device="cuda").bfloat16()
    with kernel_override("mla.prefill", "sdpa_mla_prefill"):
        res = mla_prefill(q, k, v, cu, cu, softmax_scale=SCALE, out=out)
    assert [r["kernel"] for r in selection_records() if r["op"] == "mla.prefill"][-1] == (
        "sdpa_mla_prefill"
    )
    assert res is out
    _check(out, reference.mla_prefill(q, k, v, cu, cu, softmax_scale=SCALE))


def test_prefill_registry_picks_sdpa_only_where_exact():
    """Without overrides: cuDNN SDPA for one request without prefix, Triton otherwise."""
    from tokenspeed.kernels import kernel_override, selection_records
    from tokenspeed.mla import mla_prefill, reference

    def chosen() -> str:
        return [r["kernel"] for r in selection_records() if r["op"] == "mla.prefill"][-1]

    q, k, v, cu_q, cu_k, max_q = _ragged_prefill()
    with kernel_override("mla.prefill", ""):  # lift the file's triton override
        dense = mla_prefill(q[:300], k[:300], v[:300], cu_q[:2], cu_k[:2], softmax_scale=SCALE)
        assert chosen() == "sdpa_mla_prefill"
        ragged, lse = mla_prefill(q, k, v, cu_q, cu_k, softmax_scale=SCALE, return_lse=True,
                                  max_seqlen_q=max_q)  # fmt: skip
        assert chosen() == "triton_mla_prefill"
    _check(dense, reference.mla_prefill(q[:300], k[:300], v[:300], cu_q[:2], cu_k[:2],
                                        softmax_scale=SCALE))  # fmt: skip
    _check(ragged, reference.mla_prefill(q, k, v, cu_q, cu_k, softmax_scale=SCALE))


@pytest.mark.skipif(not _fp8_ok(), reason="FP8 e4m3 needs compute capability >= 8.9")
@pytest.mark.parametrize("static", [False, True])
def test_kv_pack_fp8_matches_reference(static):
    from tokenspeed.mla import mla_kv_pack, mla_kv_pack_quantize_fp8, reference

    proj = torch.randn(1000, 700, device="cuda").bfloat16()
    kv_c, k_pe = proj[:, :512], proj[:, 600:664]
    assert torch.equal(mla_kv_pack(kv_c, k_pe), torch.cat((kv_c, k_pe), -1))
    scale = torch.tensor([0.01], device="cuda") if static else None
    packed, s = mla_kv_pack_quantize_fp8(kv_c, k_pe, scale=scale)
    # The reference runs on the CPU: torch's CUDA division by a scalar multiplies by a
    # reciprocal (1-ulp off IEEE), the kernel divides exactly (div_rn) like the CPU does.
    ref_packed, ref_s = reference.mla_kv_pack_quantize_fp8(
        kv_c.cpu(), k_pe.cpu(), scale=None if scale is None else scale.cpu()
    )
    ref_packed, ref_s = ref_packed.cuda(), ref_s.cuda()
    torch.testing.assert_close(s, ref_s, atol=0, rtol=0)
    # Both round to nearest-even from the same fp32 values: expect the same bits.
    a, e = packed.float(), ref_packed.float()
    differ = a != e
    assert differ.float().mean() < 1e-5, f"{int(differ.sum())} of {a.numel()} values differ"
    step = torch.exp2(torch.floor(torch.log2(torch.maximum(a.abs(), e.abs()).clamp_min(2**-6))) - 3)
    assert torch.all((a - e).abs() <= step)


def test_decode_cuda_graph_capture():
    """Captured once with a preallocated workspace; replays follow new lengths and queries."""
    from tokenspeed.mla import mla_decode, mla_decode_plan, reference

    q, cache, tables, lens = _decode_problem(32, 128, 2, 2048, 64, ragged=True, seed=5)
    plan = mla_decode_plan(q, cache, tables)
    assert plan.kernel == "triton_mla_decode"
    workspace = torch.empty(max(1, plan.workspace_bytes), dtype=torch.uint8, device="cuda")
    out = torch.empty(32, 2, 128, 512, dtype=torch.bfloat16, device="cuda")
    lse = [None]

    def step():
        _, lse[0] = mla_decode(q, cache, tables, lens, SCALE, out=out, return_lse=True,
                               workspace=workspace)  # fmt: skip

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile + warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in (11, 12):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        lens.copy_(torch.randint(2, 2049, (32,), generator=gen, device="cuda").int())
        q.copy_(torch.randn(q.shape, generator=gen, device="cuda").bfloat16())
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        exp, exp_lse = reference.mla_decode(q, cache, tables, lens, SCALE, return_lse=True)
        _check(out, exp)
        _check(lse[0], exp_lse, atol=1e-2, rtol=1e-3)
