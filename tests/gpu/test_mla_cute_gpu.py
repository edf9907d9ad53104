"""The CuTe DSL SM90 MLA decode against the torch reference, on a Hopper GPU.

Skipped without CUDA, on GPUs other than compute capability 9.x, and where
``nvidia-cutlass-dsl`` is not installed. Outputs are pre-filled with NaN so an unwritten
row fails; the cache tail past each request's length holds random (finite) values, as a
reused page does.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
        reason="needs an SM90 (Hopper) GPU",
    ),
    pytest.mark.skipif(importlib.util.find_spec("cutlass") is None, reason="needs CuTe DSL"),
]

SCALE = 1 / math.sqrt(192)


def _problem(lens: list[int], heads: int, q_len: int, page: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    pages_per = max(1, -(-max(lens) // page))
    total = len(lens) * pages_per + 5
    perm = torch.randperm(total, generator=gen, device="cuda")[: len(lens) * pages_per]
    tables = perm.view(len(lens), pages_per).int()
    cache = (torch.randn(total, page, 576, generator=gen, device="cuda") * 0.5).bfloat16()
    q = torch.randn(len(lens), q_len, heads, 576, generator=gen, device="cuda") * 0.5
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    return q.bfloat16(), cache, tables, seq


def _run(q, cache, tables, seq, **kwargs):
    from tokenspeed.mla import cute_decode

    out = torch.full((*q.shape[:3], 512), float("nan"), dtype=q.dtype, device="cuda")
    res, lse = cute_decode.mla_decode(q, cache, tables, seq, SCALE, out=out, return_lse=True,
                                      **kwargs)  # fmt: skip
    assert res is out
    torch.cuda.synchronize()
    return out, lse


def _expected(q, cache, tables, seq):
    from tokenspeed.mla import reference

    return reference.mla_decode(q.float(), cache.float(), tables, seq, SCALE, return_lse=True)


def _check(out, lse, exp, exp_lse, seq):
    assert not torch.isnan(out).any(), "an output row was not written"
    torch.testing.assert_close(out.float(), exp.float(), atol=2e-2, rtol=2e-2)
    live = seq > 0
    torch.testing.assert_close(lse[live], exp_lse[live], atol=2e-3, rtol=2e-3)
    assert torch.all(out[~live] == 0) and torch.all(lse[~live] == float("-inf"))


# the two bf16 kernels: KV tokens on M; 64 rows on M with each group scoring its own tile of
# a pair; each also with plain KV loads (no L2 evict-first hint)
LAYOUTS = {
    "tokens": {"layout": "tokens"},
    "pairs": {"layout": "pairs"},
    "tokens plain": {"layout": "tokens", "evict_first": 0},
    "pairs plain": {"layout": "pairs", "evict_first": 0},
    "pairs t64": {"layout": "pairs", "tile": 64, "lazy_rescale": 0, "rope_early": 0},
    "pairs t32": {"layout": "pairs", "tile": 32, "lazy_rescale": 1, "rope_early": 0},
    "pairs t32 eager": {"layout": "pairs", "tile": 32, "lazy_rescale": 0, "rope_early": 0},
    "pairs t64 rope": {"layout": "pairs", "tile": 64, "lazy_rescale": 0, "rope_early": 1},
    "pairs t32 rope": {"layout": "pairs", "tile": 32, "lazy_rescale": 1, "rope_early": 1},
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("heads", [16, 32, 64, 128])
@pytest.mark.parametrize("q_len", [1, 2])
@pytest.mark.parametrize("splits", [1, 3])
def test_flashmla_heads_ragged(heads, q_len, splits, layout):
    lens = [1000, 64, q_len, 777, 130, q_len + 63]
    q, cache, tables, seq = _problem(lens, heads, q_len, 64, seed=heads + q_len + splits)
    out, lse = _run(q, cache, tables, seq, num_splits=splits, config=LAYOUTS[layout])
    _check(out, lse, *_expected(q, cache, tables, seq), seq)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("page", [16, 32, 128])
def test_page_sizes(page, layout):
    lens = [300, 17, 256, 0]
    heads = 16 if layout.startswith("tokens") else 64
    q, cache, tables, seq = _problem(lens, heads, 1, page, seed=page)
    out, lse = _run(q, cache, tables, seq, num_splits=2, config=LAYOUTS[layout])
    _check(out, lse, *_expected(q, cache, tables, seq), seq)


@pytest.mark.parametrize("layout", ["pairs", "pairs t32"])
def test_64_row_layouts_pad_odd_rows_and_three_query_tokens(layout):
    """48 rows per request (16 heads x 3 tokens) pad a 64-row block; the causal block holds."""
    lens = [513, 3, 64, 2048]
    q, cache, tables, seq = _problem(lens, 16, 3, 64, seed=7)
    out, lse = _run(q, cache, tables, seq, num_splits=2, config=LAYOUTS[layout])
    _check(out, lse, *_expected(q, cache, tables, seq), seq)


def test_without_lse_and_with_workspace():
    from tokenspeed.mla import configs, cute_decode

    lens = [4096] * 3
    q, cache, tables, seq = _problem(lens, 64, 1, 64, seed=3)
    plan = configs.cute_decode_plan(3, 1, 64, 4096, 64, num_splits=4)
    workspace = torch.empty(plan["workspace_bytes"], dtype=torch.uint8, device="cuda")
    out = cute_decode.mla_decode(q, cache, tables, seq, SCALE, num_splits=4, workspace=workspace)
    exp, _ = _expected(q, cache, tables, seq)
    torch.testing.assert_close(out.float(), exp.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(
    "heads,config", [(32, None), (128, {"layout": "pairs"}), (128, LAYOUTS["pairs t32"])]
)
def test_cuda_graph_replay_with_new_lengths(heads, config):
    from tokenspeed.mla import configs, cute_decode

    lens = [900, 300]
    q, cache, tables, seq = _problem(lens, heads, 1, 64, seed=5)
    out = torch.empty(2, 1, heads, 512, dtype=torch.bfloat16, device="cuda")
    plan = configs.cute_decode_plan(2, 1, heads, tables.shape[1] * 64, 64, num_splits=2,
                                    config=config)  # fmt: skip
    workspace = torch.empty(plan["workspace_bytes"], dtype=torch.uint8, device="cuda")

    def step():
        cute_decode.mla_decode(q, cache, tables, seq, SCALE, out=out, num_splits=2,
                               workspace=workspace, config=config)  # fmt: skip

    step()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    seq.copy_(torch.tensor([128, 960], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    exp, _ = _expected(q, cache, tables, seq)
    torch.testing.assert_close(out.float(), exp.float(), atol=2e-2, rtol=2e-2)


def test_registry_picks_it_and_plans_its_workspace():
    import tokenspeed.mla as M
    from tokenspeed.kernels import selection_records

    lens = [2000, 1500]
    q, cache, tables, seq = _problem(lens, 16, 1, 64, seed=11)
    plan = M.mla_decode_plan(q, cache, tables, num_splits=3)
    assert plan.kernel == "cute_mla_decode_sm90" and plan.num_splits == 3
    workspace = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device="cuda")
    out = M.mla_decode(q, cache, tables, seq, SCALE, num_splits=3, workspace=workspace)
    assert plan.kernel in {r["kernel"] for r in selection_records() if r["op"] == "mla.decode"}
    exp, _ = _expected(q, cache, tables, seq)
    torch.testing.assert_close(out.float(), exp.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("layout,heads", [("pairs", 32), ("tokens", 48)])
def test_one_request_smaller_than_a_row_block(layout, heads):
    """One request of fewer rows than the CTA's block: the query is padded for the TMA box."""
    q, cache, tables, seq = _problem([700], heads, 1, 64, seed=heads)
    out, lse = _run(q, cache, tables, seq, num_splits=1, config={"layout": layout})
    _check(out, lse, *_expected(q, cache, tables, seq), seq)


# -- FP8 cache, 16 or 32 rows widened in registers (cute_decode_fp8_regs.py) ------------------


def _fp8(cache, per_token: bool):
    """The e4m3 cache and its scale: one per tensor, or one per token slot ``[P, S]``."""
    from tokenspeed.mla import reference

    flat = cache.float().view(-1, 576)
    if per_token:
        q8, scale = reference.mla_kv_pack_quantize_fp8(flat[:, :512], flat[:, 512:])
        return q8.view(cache.shape), scale.view(cache.shape[:2]).float().contiguous()
    scale = (flat.abs().amax() / 448.0).reshape(1)
    q8, _ = reference.mla_kv_pack_quantize_fp8(flat[:, :512], flat[:, 512:], scale=scale)
    return q8.view(cache.shape), scale.float()


def _expected_fp8(q, cache8, scale, tables, seq):
    from tokenspeed.mla import reference

    return reference.mla_decode(q.float(), cache8, tables, seq, SCALE, return_lse=True,
                                kv_scale=scale)  # fmt: skip


FP8_CONFIGS = {
    # the plan's four FP8 slots, and two (each consumer group one tile in flight)
    "registers": {"layout": "regs"},
    "registers, two slots": {"layout": "regs", "fp8_stages": 2},
    # the running max kept while no score passes it by more than 8 (log2 units)
    "registers, max slack 8": {"layout": "regs", "max_slack": 8},
}


@pytest.mark.parametrize("config", list(FP8_CONFIGS))
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("heads,q_len", [(16, 1), (16, 2), (32, 1), (8, 3)])
@pytest.mark.parametrize("splits", [1, 3])
def test_fp8_cache_ragged(heads, q_len, splits, per_token, config):
    lens = [1000, 64, q_len, 777, 0, q_len + 63]
    q, cache, tables, seq = _problem(lens, heads, q_len, 64, seed=heads + q_len + splits)
    cache8, scale = _fp8(cache, per_token)
    out, lse = _run(q, cache8, tables, seq, num_splits=splits, kv_scale=scale,
                    config=FP8_CONFIGS[config])  # fmt: skip
    _check(out, lse, *_expected_fp8(q, cache8, scale, tables, seq), seq)


def _growing_keys(q, cache, tables, gain: float):
    """Each request's pages scaled up along it (up to 8x), so that rows' maxima creep up and
    now and then jump; returns the query scaled by ``gain``."""
    for r in range(tables.shape[0]):
        for i, page in enumerate(tables[r].tolist()):
            cache[page] = (cache[page].float() * (1 + 7 * i / tables.shape[1])).bfloat16()
    return (q.float() * gain).bfloat16()


@pytest.mark.parametrize("slack", [0, 4, 8])
@pytest.mark.parametrize("gain", [1.0, 4.0, 30.0])
@pytest.mark.parametrize("heads,q_len", [(16, 1), (32, 1), (8, 3)])
def test_fp8_regs_max_slack(heads, q_len, gain, slack):
    """The register kernel's running max with slack: keys growing page by page along each
    request (up to 8x) and queries scaled by ``gain``, so that rows' maxima creep up, jump
    past the slack now and then (then the tile's maxima are exchanged and the output
    rescaled) and stay put in between; with the causal query block and a split per request
    half."""
    lens = [1500, 700, 64, q_len, 0]
    q, cache, tables, seq = _problem(lens, heads, q_len, 64, seed=heads + int(gain) + slack)
    q = _growing_keys(q, cache, tables, gain)
    cache8, scale = _fp8(cache, True)
    out, lse = _run(q, cache8, tables, seq, num_splits=2, kv_scale=scale,
                    config={"layout": "regs", "max_slack": slack})  # fmt: skip
    _check(out, lse, *_expected_fp8(q, cache8, scale, tables, seq), seq)


@pytest.mark.parametrize("heads", [16, 32])
@pytest.mark.parametrize("page", [16, 32, 128])
def test_fp8_cache_page_sizes(page, heads):
    lens = [300, 17, 256, 0]
    q, cache, tables, seq = _problem(lens, heads, 1, page, seed=page)
    cache8, scale = _fp8(cache, True)
    out, lse = _run(q, cache8, tables, seq, num_splits=2, kv_scale=scale)
    _check(out, lse, *_expected_fp8(q, cache8, scale, tables, seq), seq)


def test_fp8_registry_picks_it_at_any_head_count():
    import tokenspeed.mla as M

    q, cache, tables, seq = _problem([2000, 1500], 16, 1, 64, seed=13)
    cache8, scale = _fp8(cache, False)
    assert M.mla_decode_plan(q, cache8, tables).kernel == "cute_mla_decode_fp8_sm90"
    out = M.mla_decode(q, cache8, tables, seq, SCALE, kv_scale=scale)
    exp, _ = _expected_fp8(q, cache8, scale, tables, seq)
    torch.testing.assert_close(out.float(), exp.float(), atol=2e-2, rtol=2e-2)
    q64, *_ = _problem([2000, 1500], 64, 1, 64, seed=13)  # 64 rows: the register kernel's block
    plan = M.mla_decode_plan(q64, cache8, tables)
    assert (plan.kernel, plan.block_h) == ("cute_mla_decode_fp8_sm90", 64)
    out = M.mla_decode(q64, cache8, tables, seq, SCALE, kv_scale=scale)
    exp, _ = _expected_fp8(q64, cache8, scale, tables, seq)
    torch.testing.assert_close(out.float(), exp.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("layout", ["regs", "plan"])
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("heads,q_len", [(64, 1), (32, 2), (128, 1), (24, 3)])
def test_fp8_cache_more_than_32_rows(heads, q_len, per_token, layout):
    """The plan's blocks of 64 rows (the 64-row register kernel), or blocks of 32 rows of the
    16/32-row register kernel on request, each CTA reading the cache for its own block."""
    lens = [700, 0, q_len, 300]
    q, cache, tables, seq = _problem(lens, heads, q_len, 64, seed=heads * q_len)
    cache8, scale = _fp8(cache, per_token)
    config = None if layout == "plan" else {"layout": layout, "rows": 32}
    out, lse = _run(q, cache8, tables, seq, num_splits=2, kv_scale=scale, config=config)
    _check(out, lse, *_expected_fp8(q, cache8, scale, tables, seq), seq)


# -- FP8 cache, 64 rows widened in registers (cute_decode_fp8_regs64.py): the groups take turns
# scoring tiles and share each tile's values by output dims --

REGS64 = {"layout": "regs", "rows": 64}


@pytest.mark.parametrize("slack", [0, 4])
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("heads,q_len", [(64, 1), (128, 1), (32, 2), (16, 3), (24, 3)])
@pytest.mark.parametrize("splits", [1, 3])
def test_fp8_regs64_ragged(heads, q_len, splits, per_token, slack):
    """Odd and even tile counts (the last tile scored by either group), one request shorter
    than a tile, an empty one, causal query blocks, rows past the request in the block."""
    lens = [1000, 64, q_len, 777, 0, q_len + 63, 31, 129]
    q, cache, tables, seq = _problem(lens, heads, q_len, 64, seed=5 * heads + q_len + splits)
    cache8, scale = _fp8(cache, per_token)
    out, lse = _run(q, cache8, tables, seq, num_splits=splits, kv_scale=scale,
                    config={**REGS64, "max_slack": slack})  # fmt: skip
    _check(out, lse, *_expected_fp8(q, cache8, scale, tables, seq), seq)


@pytest.mark.parametrize("slack", [0, 4, 8])
@pytest.mark.parametrize("gain", [1.0, 30.0])
@pytest.mark.parametrize("heads,q_len", [(64, 1), (32, 2)])
def test_fp8_regs64_max_slack(heads, q_len, gain, slack):
    """Keys growing along each request, so the maxima the two groups hand each other move
    now and then: both groups' outputs and row sums must follow every published rescale."""
    lens = [1500, 700, 64, q_len, 0]
    q, cache, tables, seq = _problem(lens, heads, q_len, 64, seed=heads + int(gain) + slack)
    q = _growing_keys(q, cache, tables, gain)
    cache8, scale = _fp8(cache, True)
    out, lse = _run(q, cache8, tables, seq, num_splits=2, kv_scale=scale,
                    config={**REGS64, "max_slack": slack})  # fmt: skip
    _check(out, lse, *_expected_fp8(q, cache8, scale, tables, seq), seq)


@pytest.mark.parametrize("page", [16, 128])
def test_fp8_regs64_page_sizes(page):
    lens = [300, 17, 256, 0]
    q, cache, tables, seq = _problem(lens, 64, 1, page, seed=page)
    cache8, scale = _fp8(cache, True)
    out, lse = _run(q, cache8, tables, seq, num_splits=2, kv_scale=scale, config=REGS64)
    _check(out, lse, *_expected_fp8(q, cache8, scale, tables, seq), seq)


@pytest.mark.parametrize("prefetch", [1, 0])
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("heads,q_len", [(16, 1), (32, 1), (64, 1), (128, 1)])
def test_fp8_regs_page_prefetch(heads, q_len, page, prefetch):
    """The register kernels' loader reading each tile's block-table entries before its slot
    wait (the default) or after it: ragged splits whose last tile ends mid-page, a request
    shorter than a page, an empty one, and shuffled pages."""
    lens = [1000, 5, 0, 777, 130]
    q, cache, tables, seq = _problem(lens, heads, q_len, page, seed=heads + page)
    cache8, scale = _fp8(cache, True)
    config = {"layout": "regs", "page_prefetch": prefetch, **({"rows": 64} if heads >= 64 else {})}
    out, lse = _run(q, cache8, tables, seq, num_splits=3, kv_scale=scale, config=config)
    _check(out, lse, *_expected_fp8(q, cache8, scale, tables, seq), seq)


@pytest.mark.parametrize("heads", [16, 32, 64])
@pytest.mark.parametrize("per_token", [False, True])
def test_fp8_f16_query_range(per_token, heads):
    """f16 products take the query scaled by 2^-4: dims of 1e5 (past f16's 65504 unscaled)
    and of 1e-3 (subnormal in f16 once scaled) still match the reference."""
    lens = [900, 64, 333]
    q, cache, tables, seq = _problem(lens, heads, 1, 64, seed=31)
    scale = torch.ones(q.shape[-1], device="cuda")
    scale[:64] = 1e5  # some dims past f16's range ...
    scale[64:128] = 1e-3  # ... some tiny
    q = (q.float() * scale).bfloat16()
    cache8, kv_scale = _fp8(cache, per_token)
    out, lse = _run(q, cache8, tables, seq, num_splits=2, kv_scale=kv_scale)
    _check(out, lse, *_expected_fp8(q, cache8, kv_scale, tables, seq), seq)


FP8_LAYOUTS = {"regs": {"layout": "regs"}, "regs64": REGS64}


@pytest.mark.parametrize("layout", list(FP8_LAYOUTS))
@pytest.mark.parametrize("per_token", [False, True])
def test_fp8_every_byte_widens_exactly(per_token, layout):
    """One live token per request, so each head's output is that token's value vector: every
    non-NaN e4m3 byte must come out as exactly its value times the scale (subnormals too),
    and the stale slots after it, filled with NaN bytes and NaN scales, must not leak in."""
    gen = torch.Generator(device="cuda").manual_seed(21)
    batch, heads, page = 4, 16, 64
    finite = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    cache = torch.full((batch, page, 576), 0x7F, dtype=torch.uint8)  # NaN bytes everywhere
    for r in range(batch):  # token 0 of page r: every finite byte, shuffled, then repeated
        order = finite[torch.randperm(len(finite), generator=torch.Generator().manual_seed(r))]
        cache[r, 0] = order.repeat(3)[:576]
    cache = cache.cuda().view(torch.float8_e4m3fn)
    if per_token:  # powers of two: the value times its scale is exact in bf16 as well
        scale = torch.full((batch, page), float("nan"), device="cuda")
        scale[:, 0] = torch.tensor([2.0**-3, 2.0**-7, 2.0, 1.0], device="cuda")
    else:
        scale = torch.tensor([0.0123], device="cuda")
    tables = torch.arange(batch, dtype=torch.int32, device="cuda").view(batch, 1)
    seq = torch.ones(batch, dtype=torch.int32, device="cuda")
    q = (torch.randn(batch, 1, heads, 576, generator=gen, device="cuda") * 0.1).bfloat16()
    out, lse = _run(q, cache, tables, seq, num_splits=1, kv_scale=scale,
                    config=FP8_LAYOUTS[layout])  # fmt: skip
    token_scale = scale[:, 0] if per_token else scale.expand(batch)
    value = cache[:, 0, :512].float() * token_scale[:, None]
    assert torch.equal(out[:, 0].float(), value.bfloat16().float()[:, None, :].expand_as(out[:, 0]))
    score = (q[:, 0].float() * (cache[:, 0].float() * token_scale[:, None])[:, None]).sum(-1)
    torch.testing.assert_close(lse[:, 0], score * SCALE, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("heads,layout", [(16, "regs"), (32, "regs"), (64, "regs64")])
def test_fp8_cuda_graph_replay_with_new_lengths(heads, layout):
    from tokenspeed.mla import configs, cute_decode

    lens = [900, 300]
    q, cache, tables, seq = _problem(lens, heads, 1, 64, seed=23)
    cache8, scale = _fp8(cache, True)
    out = torch.empty(2, 1, heads, 512, dtype=torch.bfloat16, device="cuda")
    cfg = REGS64 if layout == "regs64" else {"layout": layout}
    plan = configs.cute_decode_plan(2, 1, heads, tables.shape[1] * 64, 64, num_splits=2,
                                    fp8=True, config=cfg)  # fmt: skip
    workspace = torch.empty(plan["workspace_bytes"], dtype=torch.uint8, device="cuda")

    def step():
        cute_decode.mla_decode(q, cache8, tables, seq, SCALE, out=out, num_splits=2,
                               workspace=workspace, kv_scale=scale, config=cfg)  # fmt: skip

    step()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for lens_now in ([128, 960], [1, 700]):
        seq.copy_(torch.tensor(lens_now, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        exp, _ = _expected_fp8(q, cache8, scale, tables, seq)
        torch.testing.assert_close(out.float(), exp.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("heads", [16, 128])
def test_registry_reads_strided_per_request_views(heads):
    """A speculative verify step's per-request views of per-row metadata (every q_len-th
    table row, each block's last length), strided, through the public op: the contiguous
    call's output exactly."""
    import tokenspeed.mla as M

    q_len, lens = 2, [700, 64, 2, 300]
    q, cache, tables, seq = _problem(lens, heads, q_len, 64, seed=heads)
    rows_tables = tables.repeat_interleave(q_len, 0)
    rows_seq = seq.repeat_interleave(q_len) - (q_len - 1) + torch.arange(
        len(lens) * q_len, device="cuda", dtype=torch.int32) % q_len  # fmt: skip
    want = M.mla_decode(q, cache, tables, seq, SCALE)
    got = M.mla_decode(q, cache, rows_tables[::q_len], rows_seq[q_len - 1 :: q_len], SCALE)
    torch.cuda.synchronize()
    assert torch.equal(got, want)
    exp, _ = _expected(q, cache, tables, seq)
    torch.testing.assert_close(got.float(), exp.float(), atol=2e-2, rtol=2e-2)
