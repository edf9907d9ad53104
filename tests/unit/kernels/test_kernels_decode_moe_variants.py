"""The decode and MoE kernel paths the defaults and the tuning space use, against the torch
reference, and the defaults themselves (the H200 sweep's winners, chosen from shapes only).

Each launch-config switch is a different code path (fused split merge, carried page ids,
TMA tiles and their pointer fallback; the Triton expert alignment and top-k sum, the
sort-free MoE, the token-major down projection). Every one runs here in Triton's interpreter
at small float32/float16 shapes, with ragged lengths, an empty request and junk block-table
columns, so a wrong index or merge fails.
"""

from __future__ import annotations

import pytest
import torch
from kernel_cases import paged_kv

from tokenspeed.kernels.device import triton_available
from tokenspeed.kernels.reference import attention as ref_attn
from tokenspeed.kernels.reference import moe as ref_moe
from tokenspeed.kernels.triton_ops import configs

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed")
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=4e-3, rtol=4e-3)}
SEQ_LENS = [1, 150, 64, 0, 129, 200]  # ragged tails, whole pages, an empty request


def close(actual, expected, dtype, scale=1.0):
    tol = {k: v * scale for k, v in TOL[dtype].items()}
    torch.testing.assert_close(actual.float(), expected.float(), **tol)


def _decode(device, dtype, page_size, cfg, seq_lens=SEQ_LENS, head_dim=32):
    from tokenspeed.kernels.triton_ops import decode_attention

    k_cache, v_cache, tables, lens = paged_kv(seq_lens, 2, head_dim, page_size, dtype, device)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(len(seq_lens), 8, head_dim, generator=gen).to(device, dtype)  # group of 4
    want = ref_attn.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.2)
    out = decode_attention.paged_decode_attention(
        q, k_cache, v_cache, tables, lens, 0.2, config=cfg
    )
    return out, want


BASE = {"num_warps": 4, "num_stages": 1}
DECODE_VARIANTS = [
    (16, {"block_n": 16, "num_splits": 3, "merge": "fused"}),
    (4, {"block_n": 16, "num_splits": 2, "merge": "fused"}),  # per-token page gather
    (16, {"block_n": 16, "num_splits": 1, "carry_pages": True}),
    (4, {"block_n": 16, "num_splits": 3, "carry_pages": True}),
    (64, {"block_n": 32, "num_splits": 2, "carry_pages": True, "merge": "fused"}),
    (64, {"block_n": 32, "num_splits": 1, "tma": True}),
    (64, {"block_n": 64, "num_splits": 3, "tma": True, "merge": "fused"}),
    (16, {"block_n": 16, "num_splits": 3, "tma": True, "carry_pages": True, "merge": "fused"}),
    # The three default plans (tiles, stages and loads of the H200 defaults).
    (64, {"block_n": 64, "num_stages": 2, "num_splits": 1, "tma": True}),
    (16, {"block_n": 64, "num_stages": 2, "num_splits": 1}),
    (16, {"block_n": 32, "num_stages": 3, "num_splits": 4, "carry_pages": True,
          "merge": "fused"}),
]  # fmt: skip


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("page_size", "cfg"), DECODE_VARIANTS)
def test_decode_variants_match_the_reference(device, dtype, page_size, cfg):
    out, want = _decode(device, dtype, page_size, {**BASE, **cfg})
    close(out, want, dtype)
    assert torch.all(out[3] == 0)  # the empty request


@needs_triton
def test_fused_merge_resets_its_counters_and_repeats_exactly(device):
    from tokenspeed.kernels.triton_ops import decode_attention

    cfg = {**BASE, "block_n": 16, "num_splits": 4, "merge": "fused"}
    first, want = _decode(device, torch.float32, 16, cfg)
    again, _ = _decode(device, torch.float32, 16, cfg)
    close(first, want, torch.float32)
    assert torch.equal(first, again)
    assert int(decode_attention.arrival_counters(torch.device(device), 1).abs().sum()) == 0


def test_grown_counter_buffers_stay_allocated_for_captured_graphs(monkeypatch):
    """A CUDA graph captured with the old buffer keeps its address: it must never be freed."""
    from tokenspeed.kernels.triton_ops import arrival, decode_attention

    monkeypatch.setattr(arrival, "_BUFFERS", {})
    monkeypatch.setattr(arrival, "_RETIRED", [])
    cpu = torch.device("cpu")
    small = decode_attention.arrival_counters(cpu, 10)
    assert decode_attention.arrival_counters(cpu, 4096) is small
    big = decode_attention.arrival_counters(cpu, 5000)
    assert big.numel() >= 5000 and not big.any()
    assert arrival._RETIRED == [small]
    assert decode_attention.arrival_counters(cpu, 100) is big


@needs_triton
@pytest.mark.parametrize("cfg", [
    {"block_n": 32, "num_splits": 2, "tma": True},
    {"block_n": 64, "num_splits": 1, "tma": True},
    {"block_n": 32, "num_splits": 1, "carry_pages": True},
])  # fmt: skip
def test_garbage_past_the_last_token_never_reaches_the_output(device, cfg):
    """Full-page tiles (TMA) read rows past the request's end: NaN there must not leak."""
    from tokenspeed.kernels.triton_ops import decode_attention

    lens = [40, 100]
    k_cache, v_cache, tables, seq = paged_kv(lens, 2, 32, 64, torch.float32, device)
    q = torch.randn(2, 8, 32, device=device)
    want = ref_attn.paged_decode_attention(q, k_cache, v_cache, tables, seq, 0.2)
    for b, n in enumerate(lens):  # poison the unused tail of each request's last page
        page = int(tables[b, (n - 1) // 64])
        k_cache[page, n % 64 :] = float("nan")
        v_cache[page, n % 64 :] = float("nan")
    out = decode_attention.paged_decode_attention(
        q, k_cache, v_cache, tables, seq, 0.2, config={**BASE, **cfg}
    )
    assert torch.isfinite(out).all()
    close(out, want, torch.float32)


@needs_triton
def test_tma_needs_page_aligned_tiles(device):
    with pytest.raises(ValueError, match="page_size % block_n"):
        _decode(device, torch.float32, 16, {**BASE, "block_n": 32, "num_splits": 1, "tma": True})


@needs_triton
def test_tma_configs_fall_back_to_pointer_loads_where_tma_cannot_run(device, monkeypatch):
    """No TMA on the device (before sm_90, ROCm) or a cache TMA cannot address: same result."""
    from tokenspeed.kernels.triton_ops import decode_attention

    cfg = {**BASE, "block_n": 64, "num_splits": 2, "tma": True, "merge": "fused"}
    used = []
    real = decode_attention._tma_descriptors
    monkeypatch.setattr(decode_attention, "_tma_descriptors",
                        lambda *a: used.append(1) or real(*a))  # fmt: skip
    monkeypatch.setattr(decode_attention, "tma_available", lambda *caches: False)
    out, want = _decode(device, torch.float32, 64, cfg)
    close(out, want, torch.float32)
    assert not used
    monkeypatch.undo()
    k_cache, *_ = paged_kv([5], 2, 36, 64, torch.float16, device)  # 72-byte rows
    assert not decode_attention.tma_available(k_cache)
    k_cache, *_ = paged_kv([5], 2, 32, 64, torch.float16, device)
    assert decode_attention.tma_available(k_cache)


def test_decode_defaults_are_the_h200_sweep_winners(monkeypatch):
    """Llama-3-8B heads on 132 SMs: the per-shape winners of the 2026-12-01 sweep."""
    monkeypatch.setattr(configs, "num_sms", lambda: 132)
    llama = {"num_kv_heads": 8, "head_dim": 128, "v_head_dim": 128}

    def default(batch, kv_len, page):
        return configs.decode_default_config({**llama, "batch": batch, "kv_len": kv_len,
                                              "page_size": page})  # fmt: skip

    tma = {"block_n": 64, "num_warps": 4, "num_stages": 2, "tma": True}
    assert default(64, 2048, 64) == {**tma, "num_splits": 1}  # tma-n64-s2, 99.1%
    assert default(16, 8192, 64) == {**tma, "num_splits": 4, "merge": "fused"}  # 95.8%
    assert default(64, 2048, 128) == {**tma, "num_splits": 1}  # any multiple of 64
    # The groups fill a wave of 4 per SM: one split of 32-token carried tiles (n32-carry-s3
    # beat 64-token tiles at 2 stages in six H200 runs of seven, 2026-12-01/02).
    assert default(64, 2048, 16) == {"block_n": 32, "num_warps": 4, "num_stages": 3,
                                     "num_splits": 1, "carry_pages": True}  # fmt: skip
    # 128 (request, KV head) groups fill 132 SMs once: one wide program each (2026-12-02).
    assert default(16, 8192, 16) == {"block_n": 128, "num_warps": 8, "num_stages": 3,
                                     "num_splits": 1, "carry_pages": True}  # fmt: skip
    # Fewer groups, or short contexts: split for one wave (n32-carry-s3, 93.5% at 16 x 8k).
    for batch, kv_len in ((8, 8192), (16, 2048)):
        cfg = default(batch, kv_len, 16)
        assert cfg["block_n"] == 32 and cfg["carry_pages"] and cfg["num_splits"] > 1
    # Wider heads keep the previous plan: no TMA, ~4 programs per SM.
    wide = configs.decode_default_config({**llama, "head_dim": 256, "v_head_dim": 256,
                                          "batch": 16, "kv_len": 8192, "page_size": 64})  # fmt: skip
    assert "tma" not in wide and wide["num_splits"] == configs.decode_num_splits(
        {**llama, "batch": 16, "kv_len": 8192}
    )


def test_decode_space_holds_every_surviving_switch_and_only_valid_configs(monkeypatch):
    from tokenspeed.kernels.triton_ops.decode_attention import _check_config

    monkeypatch.setattr(configs, "num_sms", lambda: 132)
    for page in (16, 64):
        traits = {"num_kv_heads": 8, "head_dim": 128, "batch": 16, "kv_len": 8192,
                  "page_size": page}  # fmt: skip
        space = configs.decode_config_space(traits)
        assert space[0] == configs.decode_default_config(traits)
        assert len(space) == len({tuple(sorted(c.items())) for c in space})
        for cfg in space:
            _check_config(cfg, page)
        keys = set().union(*space)
        assert {"block_n", "num_warps", "num_stages", "num_splits", "carry_pages", "merge",
                "tma"} == keys  # fmt: skip
        assert any(c.get("tma") for c in space) and any(c.get("carry_pages") for c in space)


def test_wave_splits_fill_one_wave_with_equal_shares():
    llama = {"num_kv_heads": 8, "head_dim": 128, "page_size": 16}
    # 64 x 8 = 512 programs already fit 4-5 per SM on 132 SMs: no split.
    assert configs.decode_wave_splits({**llama, "batch": 64, "kv_len": 2048}, 5, 132) == 1
    # 16 x 8 = 128 programs: 4 per SM allows 4 splits of 32 tiles, 5 per SM five of <= 26.
    assert configs.decode_wave_splits({**llama, "batch": 16, "kv_len": 8192}, 4, 132) == 4
    assert configs.decode_wave_splits({**llama, "batch": 16, "kv_len": 8192}, 5, 132) == 5
    # Never below 256 tokens per split.
    assert configs.decode_wave_splits({**llama, "batch": 1, "kv_len": 512}, 5, 132) == 2
    for batch, kv_len, ctas in [(3, 100, 2), (256, 4096, 3), (1, 131072, 4)]:
        traits = {**llama, "batch": batch, "kv_len": kv_len}
        splits = configs.decode_wave_splits(traits, ctas, 132)
        assert splits >= 1
        assert splits == 1 or batch * 8 * splits <= ctas * 132


# -- fused MoE -------------------------------------------------------------------------------


def _moe(device, dtype, tokens, top_k, experts, hidden=40, inter=24):
    x = torch.randn(tokens, hidden, device=device).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, device=device) / hidden**0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, device=device) / inter**0.5).to(dtype)
    weights, ids = ref_moe.moe_route(
        torch.randn(tokens, experts, device=device), top_k, renormalize=True
    )
    return (x, w13, w2, weights, ids), ref_moe.fused_moe(x, w13, w2, weights, ids)


TILES = {"block_m": 16, "block_n": 16, "block_k": 16, "num_warps": 4, "num_stages": 1}
SMALL_DOWN = {"down_block_n": 16, "down_block_k": 16, "down_num_stages": 1}
MOE_VARIANTS = [
    {"align": "triton"},
    {"align": "triton", "reduce": "triton"},
    {"path": "sortfree"},
    {"path": "sortfree", "reduce": "triton", "down_block_n": 32},
    {"path": "sortfree", "down": "token", **SMALL_DOWN},
    {"align": "triton", "down": "token", **SMALL_DOWN},
]


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("tokens", "top_k", "experts"), [(1, 2, 8), (3, 4, 8), (13, 3, 6)])
@pytest.mark.parametrize("extra", MOE_VARIANTS)
def test_moe_variants_match_the_reference(device, dtype, tokens, top_k, experts, extra):
    from tokenspeed.kernels.triton_ops import fused_moe

    args, want = _moe(device, dtype, tokens, top_k, experts)
    out = fused_moe.fused_moe(*args, config={**TILES, **extra})
    close(out, want, dtype, scale=2.0)  # float16 rounds the intermediate activation


@needs_triton
@pytest.mark.parametrize("down", ["expert", "token"])
def test_sort_free_experts_with_more_pairs_than_a_tile(device, down):
    """40 tokens over 4 experts: ~20 pairs per expert, tiles of 16 rows (two chunks)."""
    from tokenspeed.kernels.triton_ops import fused_moe

    args, want = _moe(device, torch.float32, 40, 2, 4)
    out = fused_moe.fused_moe(*args, config={**TILES, **SMALL_DOWN, "path": "sortfree",
                                             "down": down})  # fmt: skip
    close(out, want, torch.float32)


def test_moe_defaults_are_the_h200_sweep_winners():
    """Qwen3-30B-A3B (128 experts, top-8): the per-token-count winners of 2026-12-01."""
    qwen = {"top_k": 8, "num_experts": 128, "hidden": 2048, "intermediate": 768}

    def default(tokens):
        return configs.moe_default_config({**qwen, "num_tokens": tokens})

    for tokens in (1, 2, 4, 8):  # sortfree-token-n32 (six down stages at one token)
        assert default(tokens) == {
            "path": "sortfree", "down": "token", "block_m": 16, "block_n": 32, "block_k": 128,
            "num_warps": 4, "num_stages": 4, "down_block_n": 16, "down_block_k": 256,
            "down_num_warps": 4, "down_num_stages": 6 if tokens == 1 else 4,
        }  # fmt: skip
    assert default(16) == {  # sortfree-expert
        "path": "sortfree", "reduce": "triton", "block_m": 16, "block_n": 32, "block_k": 128,
        "num_warps": 4, "num_stages": 4, "down_block_n": 32, "down_block_k": 128,
    }  # fmt: skip
    fewer = {"align": "triton", "reduce": "triton"}
    for tokens in (32, 64, 128):  # fewer-launches
        assert default(tokens) == {"block_m": 16, "block_n": 64, "block_k": 128, "num_warps": 4,
                                   "num_stages": 3, **fewer}  # fmt: skip
    assert default(256) == {"block_m": 32, "block_n": 64, "block_k": 64, "num_warps": 4,
                            "num_stages": 3, **fewer}  # m32-n64-k64  # fmt: skip
    assert "align" not in default(4096) and default(4096)["block_m"] == 64  # unmeasured
    # Few experts, so tokens share them at once: expert-major down even for one token.
    assert configs.moe_default_config({"top_k": 2, "num_experts": 2, "num_tokens": 1}).get(
        "down", "expert") == "expert"  # fmt: skip


def test_moe_space_holds_both_paths_for_small_batches_and_the_default_first():
    from tokenspeed.kernels.triton_ops.fused_moe import _check_config

    for tokens in (1, 16, 64):
        traits = {"top_k": 8, "num_experts": 128, "num_tokens": tokens}
        space = configs.moe_config_space(traits)
        assert space[0] == configs.moe_default_config(traits)
        assert len(space) == len({tuple(sorted(c.items())) for c in space})
        for cfg in space:
            _check_config(cfg)
        paths = {c.get("path", "sorted") for c in space}
        assert paths == ({"sorted", "sortfree"} if tokens <= 16 else {"sorted"})
        assert any(c.get("align") == "triton" for c in space)


@needs_triton
@pytest.mark.parametrize(("tokens", "top_k", "experts", "path"), [
    (1, 2, 8, "token"), (3, 2, 8, "expert"), (13, 3, 6, "expert"), (40, 2, 8, "sorted"),
])  # fmt: skip
def test_moe_default_config_runs_every_default_path(device, tokens, top_k, experts, path):
    from tokenspeed.kernels.triton_ops import fused_moe

    cfg = configs.moe_default_config({"num_tokens": tokens, "top_k": top_k,
                                      "num_experts": experts})  # fmt: skip
    got = "sorted" if cfg.get("path", "sorted") == "sorted" else cfg.get("down", "expert")
    assert got == path
    args, want = _moe(device, torch.float32, tokens, top_k, experts)
    close(fused_moe.fused_moe(*args), want, torch.float32, scale=2.0)


@needs_triton
@pytest.mark.parametrize(("pairs", "experts", "block_m"), [(8, 128, 16), (100, 16, 4), (37, 5, 16),
                                                           (300, 8, 32)])  # fmt: skip
def test_triton_alignment_gives_the_same_blocks(device, pairs, experts, block_m):
    from tokenspeed.kernels.triton_ops.fused_moe import align_by_expert, align_by_expert_triton

    ids = torch.randint(0, experts, (pairs, 1), dtype=torch.int32, device=device)
    want_ids, want_blocks = align_by_expert(ids, experts, block_m)
    got_ids, got_blocks = align_by_expert_triton(ids, experts, block_m)
    assert torch.equal(got_blocks, want_blocks)
    for blk in range(want_blocks.numel()):  # same pairs per block; order inside may differ
        rows = slice(blk * block_m, (blk + 1) * block_m)
        assert sorted(got_ids[rows].tolist()) == sorted(want_ids[rows].tolist())


@needs_triton
def test_unknown_moe_switch_is_rejected(device):
    from tokenspeed.kernels.triton_ops import fused_moe

    args, _ = _moe(device, torch.float32, 2, 2, 4)
    with pytest.raises(ValueError, match="path"):
        fused_moe.fused_moe(*args, config={**TILES, "path": "bogus"})
