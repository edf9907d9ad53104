"""MLA kernels in the registry, the decode launch plan, and the package's import rule."""

from __future__ import annotations

import subprocess
import sys

import pytest

import tokenspeed.mla as M
from tokenspeed.kernels import all_kernels, explain_selection
from tokenspeed.kernels.device import DeviceInfo, triton_available
from tokenspeed.mla import configs

H200 = DeviceInfo(kind="cuda", vendor="nvidia", name="NVIDIA H200", compute=(9, 0), num_sms=132)
A100 = DeviceInfo(kind="cuda", vendor="nvidia", name="NVIDIA A100", compute=(8, 0), num_sms=108)


def test_every_mode_has_a_reference_and_a_triton_kernel():
    by_mode: dict[str, set[str]] = {}
    for spec in all_kernels():
        if spec.family == "mla":
            by_mode.setdefault(spec.mode, set()).add(spec.solution)
    assert set(by_mode) == {"decode", "prefill", "kv_pack", "kv_pack_fp8", "store_kv"}
    for solutions in by_mode.values():
        assert "torch" in solutions
        if triton_available():
            assert "triton" in solutions


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_selection_on_gpus():
    bf16 = {"q": "bfloat16", "kv_cache": "bfloat16"}
    fp8 = {"q": "bfloat16", "kv_cache": "float8_e4m3fn"}
    import importlib.util

    # bf16 on Hopper: the CuTe DSL kernel where nvidia-cutlass-dsl is installed, else Triton
    cute = importlib.util.find_spec("cutlass") is not None
    want = "cute_mla_decode_sm90" if cute else "triton_mla_decode"
    assert explain_selection("mla", "decode", bf16, device=H200).chosen == want
    # FP8 on Hopper: the CuTe converter pipeline at any head count (blocks of 32 rows) where
    # CuTe DSL is installed, else Triton; Triton past 16 query tokens
    want_fp8 = "cute_mla_decode_fp8_sm90" if cute else "triton_mla_decode_fp8"
    for heads in (16, 128):
        traits = {"num_heads": heads, "q_len": 2, "page_size": 64}
        assert (
            explain_selection("mla", "decode", fp8, traits=traits, device=H200).chosen == want_fp8
        )
    long_block = {"num_heads": 16, "q_len": 17, "page_size": 64}
    chosen = explain_selection("mla", "decode", fp8, traits=long_block, device=H200).chosen
    assert chosen != "cute_mla_decode_fp8_sm90"
    # Triton has no e4m3 before compute capability 8.9: the reference serves FP8 on an A100.
    explained = explain_selection("mla", "decode", fp8, device=A100)
    assert explained.chosen == "torch_mla_decode"
    assert "compute capability" in str(explained)
    on_cpu = explain_selection("mla", "decode", bf16, device="cpu")
    assert on_cpu.chosen == "torch_mla_decode"


def test_fold_factor_follows_the_seed_rule():
    assert configs.fold_factor(64, 4) == 2  # H_eff = 128, two query groups
    assert configs.fold_factor(16, 4) == 4
    assert configs.fold_factor(128, 2) == 1
    assert configs.fold_factor(32, 3) == 3
    assert configs.fold_factor(48, 3) == 1  # 144 rows would exceed 128
    assert configs.fold_factor(16, 4, 2) == 2
    with pytest.raises(ValueError):
        configs.fold_factor(16, 4, 3)


def test_decode_plan_flashmla_shapes_on_h200():
    """Batch 128 x 4k on 132 SMs: 64-row blocks, splits only where the grid is short."""
    plans = {}
    for heads in (16, 32, 64, 128):
        for q_len in (1, 2):
            traits = {"num_heads": heads, "q_len": q_len, "kv_lora_rank": 512,
                      "batch": 128, "kv_len": 4096}  # fmt: skip
            cfg = configs.decode_default_config(traits)
            fold = configs.fold_factor(heads, q_len)
            block_h = configs.decode_block_h(heads * fold, cfg["block_h"])
            _, _, blocks = configs.decode_geometry(heads, q_len, fold, block_h)
            splits = configs.decode_num_splits(128, blocks, 4096, block_h, sms=132)
            plans[(heads, q_len)] = (block_h, blocks, splits)
    assert plans[(16, 1)] == (16, 1, 2)
    assert plans[(64, 1)] == (64, 1, 1)
    assert plans[(128, 1)] == (64, 2, 1)
    assert plans[(64, 2)] == (64, 2, 1)  # both query tokens folded, one KV pass per 64 rows
    assert plans[(16, 2)][0] == 32
    # A small batch over a long context splits to fill the GPU, within the cap.
    assert configs.decode_num_splits(2, 2, 80_000, 64, sms=132) == 30  # 120 of 132 slots
    assert configs.decode_num_splits(1, 1, 300, 64, sms=132) == 1


def test_workspace_bytes():
    assert configs.decode_workspace_bytes(4, 2, 16, 1, 512) == 0
    assert configs.decode_workspace_bytes(4, 2, 16, 3, 512) == 4 * 2 * 16 * 3 * 513 * 4


def test_config_space_is_valid():
    traits = {"num_heads": 128, "q_len": 1, "kv_lora_rank": 512, "batch": 128, "kv_len": 4096}
    space = configs.decode_config_space(traits)
    keys = {"block_h", "block_n", "num_warps", "num_stages", "num_splits", "q_reload",
            "tokens_on_m", "tma"}  # fmt: skip
    assert space and all(set(c) == keys and c["block_h"] in (16, 32, 64) for c in space)
    assert not any((c["tokens_on_m"] or c["tma"]) and c["q_reload"] for c in space)
    assert any(c["tokens_on_m"] and c["tma"] for c in space)
    assert not any(c["tokens_on_m"] and c["tma"] and c["block_n"] > 32 for c in space)
    assert set(configs.decode_default_config(traits)) == keys


@pytest.mark.parametrize(
    "heads,q_len,tokens_on_m", [(16, 1, 0), (32, 1, 1), (16, 2, 1), (64, 1, 0), (128, 2, 0)]
)
def test_decode_default_layout_by_rows(heads, q_len, tokens_on_m):
    """32-row blocks run transposed (KV tokens on M) in 16-token tiles, 16 and 64 rows keep
    rows on M; over an FP8 cache the transposed launch keeps pointer loads."""
    traits = {"num_heads": heads, "q_len": q_len, "kv_lora_rank": 512, "batch": 128,
              "kv_len": 4096}  # fmt: skip
    bf16, fp8 = configs.decode_default_config(traits), configs.decode_default_config_fp8(traits)
    assert bf16["tokens_on_m"] == fp8["tokens_on_m"] == tokens_on_m
    if tokens_on_m:
        assert (bf16["block_h"], bf16["block_n"], fp8["block_n"], fp8["tma"]) == (32, 16, 16, 0)
    else:
        assert fp8 == bf16
    plan = configs.plan_decode(128, q_len, heads, 4096, 64, fp8=True)
    assert plan["tokens_on_m"] == tokens_on_m and plan["block_n"] == fp8["block_n"]


@pytest.mark.parametrize(
    "heads,page,tma,block_n",
    [(16, 64, 1, 32), (64, 64, 1, 64), (64, 16, 0, 32), (32, 64, 1, 16), (32, 8, 0, 16)],
)
def test_decode_default_takes_tma_on_hopper_where_tiles_fit_pages(monkeypatch, heads, page, tma,
                                                                  block_n):  # fmt: skip
    """On a GPU with TMA, launches fetch whole tiles by TMA when a tile fits in a page (64-token
    tiles at 64 rows, 32 at 16, 16 at 32 transposed rows); without TMA they keep pointer loads.
    Over an FP8 cache the transposed launch keeps pointer loads (TMA measured slower there)."""
    traits = {"num_heads": heads, "q_len": 1, "kv_lora_rank": 512, "batch": 128,
              "kv_len": 4096, "page_size": page}  # fmt: skip
    monkeypatch.setattr(configs, "tma_capable", lambda: True)
    cfg, fp8 = configs.decode_default_config(traits), configs.decode_default_config_fp8(traits)
    assert (cfg["tma"], cfg["block_n"]) == (tma, block_n)
    assert fp8["tma"] == (0 if fp8["tokens_on_m"] else tma)
    monkeypatch.setattr(configs, "tma_capable", lambda: False)
    assert configs.decode_default_config(traits)["tma"] == 0


def test_mla_never_imports_runtime():
    code = (
        "import sys, tokenspeed.mla, tokenspeed.mla.bench; "
        "bad = [m for m in sys.modules if m.startswith('tokenspeed.runtime')]; "
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_public_api():
    for name in ("mla_decode", "mla_prefill", "mla_kv_pack_quantize_fp8", "mla_store_kv",
                 "mla_decode_plan", "mla_kv_pack"):  # fmt: skip
        assert callable(getattr(M, name))


def test_cute_decode_plan_rows_groups_pages_and_workspace():
    plan = configs.cute_decode_plan(128, 1, 16, 4096, 64)
    assert plan["layout"] == "tokens"
    assert (plan["rows"], plan["wgs"], plan["row_blocks"], plan["page_block"]) == (16, 1, 1, 64)
    plan = configs.cute_decode_plan(8, 2, 128, 4096, 16, num_splits=3)
    assert plan["layout"] == "pairs"
    assert (plan["rows"], plan["wgs"], plan["row_blocks"], plan["page_block"]) == (64, 2, 4, 16)
    assert plan["workspace_bytes"] == 8 * 2 * 128 * 3 * 513 * 4
    # up to 32 rows per request the tokens layout; from 64 the pairs layout (64-row blocks)
    plan = configs.cute_decode_plan(8, 1, 32, 4096, 64)
    assert (plan["layout"], plan["rows"], plan["wgs"]) == ("tokens", 32, 1)
    plan = configs.cute_decode_plan(8, 1, 64, 4096, 64)
    assert (plan["layout"], plan["rows"], plan["row_blocks"]) == ("pairs", 64, 1)
    plan = configs.cute_decode_plan(8, 3, 16, 4096, 64)  # 48 rows: one padded 64-row block
    assert (plan["layout"], plan["rows"], plan["row_blocks"]) == ("pairs", 64, 1)
    # the 64-row kernel on request, at any row count
    plan = configs.cute_decode_plan(8, 1, 32, 4096, 64, config={"layout": "pairs"})
    assert (plan["layout"], plan["rows"], plan["wgs"], plan["row_blocks"]) == ("pairs", 64, 2, 1)
    for layout in ("diagonal", "heads", "regs"):  # "regs" widens an FP8 cache
        with pytest.raises(ValueError, match="'tokens' or 'pairs'"):
            configs.cute_decode_plan(8, 1, 32, 4096, 64, config={"layout": layout})
    # KV tiles load under the L2 evict-first hint unless a config turns it off
    assert configs.cute_decode_plan(8, 1, 64, 4096, 64)["evict_first"] == 1
    plain = configs.cute_decode_plan(8, 1, 64, 4096, 64, config={"evict_first": 0})
    assert plain["evict_first"] == 0
    # the producer reads the next tile's block-table entries ahead, unless turned off
    assert configs.cute_decode_plan(8, 1, 32, 4096, 64)["page_prefetch"] == 1
    late = configs.cute_decode_plan(8, 1, 32, 4096, 64, config={"page_prefetch": 0})
    assert late["page_prefetch"] == 0
    # so do the FP8 register kernels' loaders (16/32 and 64 rows), unless turned off
    for heads in (16, 32, 64, 128):
        assert configs.cute_decode_plan(8, 1, heads, 4096, 64, fp8=True)["page_prefetch"] == 1
    late8 = configs.cute_decode_plan(8, 1, 64, 4096, 64, fp8=True, config={"page_prefetch": 0})
    assert late8["page_prefetch"] == 0


def test_cute_decode_plan_rejects_unknown_keys():
    """A misspelt or retired plan key (the removed kernels' ``persistent``,
    ``converter_wgs``, ``widener_regs``, ``mma_dtype``) is an error naming it, not a launch
    that silently ignores it."""
    for bad in ({"persistent": 1}, {"converter_wgs": 2}, {"mma_dtype": "bf16"}, {"tiles": 32}):
        for fp8 in (False, True):
            with pytest.raises(ValueError, match=f"unknown .*{next(iter(bad))}"):
                configs.cute_decode_plan(8, 1, 32, 4096, 64, fp8=fp8, config=bad)


def test_cute_pairs_plan_tile():
    """64-token tiles at any row count; a config may pick 32-token tiles (a ring of two
    pairs), which bring the lazy rescale with them."""
    plan = configs.cute_decode_plan(128, 1, 64, 4096, 64)
    assert (plan["layout"], plan["tile"], plan["lazy_rescale"], plan["page_block"]) == (
        "pairs", 64, 0, 64,
    )  # fmt: skip
    plan = configs.cute_decode_plan(128, 2, 32, 4096, 16)
    assert (plan["tile"], plan["lazy_rescale"], plan["page_block"]) == (64, 0, 16)
    plan = configs.cute_decode_plan(128, 1, 128, 4096, 64)
    assert (plan["tile"], plan["lazy_rescale"], plan["page_block"]) == (64, 0, 64)
    # the rope blocks released early with two row blocks per request, not with one
    assert plan["rope_early"] == 1
    assert configs.cute_decode_plan(128, 1, 64, 4096, 64)["rope_early"] == 0
    assert configs.cute_decode_plan(128, 2, 64, 4096, 64)["rope_early"] == 1
    assert configs.cute_decode_plan(128, 1, 128, 4096, 64, config={"rope_early": 0})[
        "rope_early"] == 0  # fmt: skip
    plan = configs.cute_decode_plan(128, 1, 64, 4096, 64, config={"tile": 32})
    assert (plan["tile"], plan["lazy_rescale"], plan["page_block"]) == (32, 1, 32)
    plan = configs.cute_decode_plan(128, 2, 32, 4096, 16, config={"tile": 32})
    assert (plan["tile"], plan["lazy_rescale"], plan["page_block"]) == (32, 1, 16)
    plan = configs.cute_decode_plan(128, 1, 16, 4096, 64)  # the tokens layout: whole tiles
    assert (plan["layout"], plan["tile"], plan["lazy_rescale"]) == ("tokens", 64, 0)
    with pytest.raises(ValueError, match="tile"):
        configs.cute_decode_plan(128, 1, 64, 4096, 64, config={"tile": 16})
    with pytest.raises(ValueError, match="tile"):
        configs.cute_decode_plan(128, 1, 16, 4096, 64, config={"tile": 32})


def test_cute_fp8_decode_plan_rings_and_limits():
    """An FP8 cache takes the register kernels: blocks of 16 or 32 rows with four FP8 slots
    in the shared memory the query and p^T leave (query 36 + 2 x 4 + 4 x 40 KiB at 32 rows;
    five fit at 16 with a few KiB to spare, four are the plan's), and blocks of 64 rows
    above 32 with three (query 72 + 2 x 8 + 3 x 40 KiB; a fourth does not fit)."""
    plan = configs.cute_decode_plan(128, 1, 32, 4096, 64, fp8=True)
    assert (plan["layout"], plan["rows"], plan["wgs"], plan["row_blocks"]) == ("regs", 32, 2, 1)
    assert (plan["stages"], plan["fp8_stages"], plan["max_slack"]) == (0, 4, 4)
    small = configs.cute_decode_plan(128, 1, 16, 4096, 64, fp8=True)
    assert (small["layout"], small["rows"], small["fp8_stages"]) == ("regs", 16, 4)
    mtp = configs.cute_decode_plan(8, 3, 8, 4096, 16, fp8=True)  # 24 rows: one 32-row block
    assert (mtp["layout"], mtp["rows"], mtp["row_blocks"], mtp["page_block"]) == ("regs", 32, 1, 16)
    assert configs.cute_decode_plan(8, 1, 32, 4096, 64, fp8=True,
                                    config={"fp8_stages": 2})["fp8_stages"] == 2  # fmt: skip
    for heads, q_len, blocks in ((64, 1, 1), (128, 1, 2), (32, 2, 1), (16, 3, 1)):
        wide = configs.cute_decode_plan(128, q_len, heads, 4096, 64, fp8=True)
        got = (wide["layout"], wide["rows"], wide["row_blocks"], wide["fp8_stages"])
        assert got == ("regs", 64, blocks, 3)
    with pytest.raises(ValueError, match="shared memory"):
        configs.cute_decode_plan(8, 1, 64, 4096, 64, fp8=True, config={"fp8_stages": 4})
    with pytest.raises(ValueError, match="16, 32 or 64 per CTA"):
        configs.cute_decode_plan(8, 1, 64, 4096, 64, fp8=True, config={"rows": 48})
    with pytest.raises(ValueError, match="shared memory"):  # a fifth slot at 32 rows
        configs.cute_decode_plan(8, 1, 32, 4096, 64, fp8=True, config={"fp8_stages": 5})
    with pytest.raises(ValueError, match="shared memory"):  # a sixth at 16
        configs.cute_decode_plan(8, 1, 16, 4096, 64, fp8=True, config={"fp8_stages": 6})
    with pytest.raises(ValueError, match="shared memory"):  # one slot: nothing in flight
        configs.cute_decode_plan(8, 1, 32, 4096, 64, fp8=True, config={"fp8_stages": 1})
    with pytest.raises(ValueError, match="two consumer groups"):
        configs.cute_decode_plan(8, 1, 32, 4096, 64, fp8=True, config={"stages": 2})
    for layout in ("tokens", "pairs", "heads"):  # the FP8 kernels retired in session 39
        with pytest.raises(ValueError, match="register layout"):
            configs.cute_decode_plan(8, 1, 16, 4096, 64, fp8=True, config={"layout": layout})
    # the running max's slack: 4 unless asked (0: exact every tile), at most 8 (P within 256)
    exact = configs.cute_decode_plan(8, 1, 32, 4096, 64, fp8=True, config={"max_slack": 0})
    assert exact["max_slack"] == 0
    assert configs.cute_decode_plan(8, 1, 32, 4096, 64)["max_slack"] == 0  # bf16: none
    with pytest.raises(ValueError, match="max_slack=9"):
        configs.cute_decode_plan(8, 1, 32, 4096, 64, fp8=True, config={"max_slack": 9})
    assert configs.cute_decode_plan(8, 1, 16, 4096, 64)["fp8_stages"] == 0  # bf16: none


def test_cute_decode_needs_hopper_and_cute_dsl():
    import importlib.util

    bf16 = {"q": "bfloat16", "kv_cache": "bfloat16"}
    traits = {"kv_lora_rank": 512, "head_dim": 576, "q_len": 1, "page_size": 64}
    on_a100 = explain_selection("mla", "decode", bf16, traits=traits, device=A100)
    assert on_a100.chosen != "cute_mla_decode_sm90" and "cute_mla_decode_sm90" in str(on_a100)
    on_h200 = explain_selection("mla", "decode", bf16, traits=traits, device=H200)
    if importlib.util.find_spec("cutlass") is None:
        assert on_h200.chosen != "cute_mla_decode_sm90"
        assert "cutlass" in str(on_h200)
    else:
        assert on_h200.chosen == "cute_mla_decode_sm90"
    odd_page = explain_selection("mla", "decode", bf16, traits={**traits, "page_size": 96},
                                 device=H200)  # fmt: skip
    assert odd_page.chosen != "cute_mla_decode_sm90"


def test_cute_decode_refuses_wrong_cache_and_scale_combinations_before_launching():
    """Checked on the host from dtypes and shapes, so no GPU is needed to see them."""
    pytest.importorskip("cutlass")
    import torch

    from tokenspeed.mla import cute_decode

    q = torch.zeros(2, 1, 16, 576, dtype=torch.bfloat16)
    bf16 = torch.zeros(4, 64, 576, dtype=torch.bfloat16)
    fp8 = bf16.to(torch.float8_e4m3fn)
    tables = torch.zeros(2, 2, dtype=torch.int32)
    seq = torch.full((2,), 100, dtype=torch.int32)
    scale = torch.ones(1)
    with pytest.raises(ValueError, match="kv_scale"):
        cute_decode.mla_decode(q, fp8, tables, seq, 0.1)
    with pytest.raises(ValueError, match="kv_scale"):
        cute_decode.mla_decode(q, bf16, tables, seq, 0.1, kv_scale=scale)
    with pytest.raises(ValueError, match="bf16 query"):
        cute_decode.mla_decode(q.half(), bf16, tables, seq, 0.1)
    with pytest.raises(ValueError, match="16, 32 or 64 per CTA"):
        cute_decode.mla_decode(torch.zeros(2, 1, 64, 576, dtype=torch.bfloat16), fp8, tables,
                               seq, 0.1, kv_scale=scale, config={"rows": 48})  # fmt: skip
    with pytest.raises(ValueError, match="one scale per token slot"):
        cute_decode.mla_decode(q, fp8, tables, seq, 0.1, kv_scale=torch.ones(4, 63))


def test_cute_decode_builds_the_kernel_each_plan_names():
    """The plan-to-kernel step runs without a GPU: each layout's kernel object carries the
    plan's tile, rescale, page copies and block-table prefetch."""
    cutlass = pytest.importorskip("cutlass")
    from tokenspeed.mla import cute_decode
    from tokenspeed.mla.cute_decode_fp8_regs import MlaDecodeFp8RegsSm90
    from tokenspeed.mla.cute_seesaw_pairs import MlaDecodeSeesawPairsSm90

    def build(plan, fp8=False, split=False):
        spec = cute_decode._kernel_spec(plan, fp8, fp8, split, True, "")
        return cute_decode.decode_kernel(spec)

    pairs32 = build(configs.cute_decode_plan(128, 1, 64, 4096, 64, config={"tile": 32}))
    assert isinstance(pairs32, MlaDecodeSeesawPairsSm90)
    assert (pairs32.tile, pairs32.lazy_rescale, pairs32.stages, pairs32.copies_per_tile) == (
        32, True, 4, 1)  # fmt: skip
    pairs64 = build(configs.cute_decode_plan(128, 1, 128, 4096, 16), split=True)
    assert (pairs64.tile, pairs64.lazy_rescale, pairs64.stages, pairs64.copies_per_tile) == (
        64, False, 2, 4)  # fmt: skip
    assert pairs64.split and pairs64.page_prefetch and pairs64.rope_early
    assert pairs64.parts == 3 and not pairs32.rope_early and pairs32.parts == 2
    tokens = build(configs.cute_decode_plan(128, 1, 16, 4096, 64, config={"page_prefetch": 0}))
    assert isinstance(tokens, cute_decode.MlaDecodeSm90) and not tokens.page_prefetch
    regs = build(configs.cute_decode_plan(128, 1, 32, 4096, 64, fp8=True), fp8=True)
    assert isinstance(regs, MlaDecodeFp8RegsSm90) and regs.per_token
    assert (regs.rows, regs.fp8_stages, regs.threads, regs.value_buffers) == (32, 4, 384, 1)
    slack = build(configs.cute_decode_plan(8, 1, 16, 4096, 64, fp8=True,
                                           config={"max_slack": 0}), fp8=True)  # fmt: skip
    assert (slack.rows, slack.max_slack, regs.max_slack) == (16, 0, 4)
    from tokenspeed.mla.cute_decode_fp8_regs64 import MlaDecodeFp8Regs64Sm90

    plan64 = configs.cute_decode_plan(8, 1, 64, 4096, 64, fp8=True,
                                      config={"layout": "regs", "rows": 64})  # fmt: skip
    regs64 = build(plan64, fp8=True)
    assert isinstance(regs64, MlaDecodeFp8Regs64Sm90)
    assert (regs64.rows, regs64.fp8_stages, regs64.slot_readers, regs64.max_slack) == (64, 3, 8, 4)
    with pytest.raises(ValueError, match="3 FP8 slots"):
        MlaDecodeFp8Regs64Sm90(64, 4, False, True, True)
    # setmaxnreg moves registers within the launch's 168 x 384: 2 x 240 + 24 = 3 x 168
    assert 2 * regs.consumer_regs + regs.loader_regs == 3 * 168
    assert regs.mma_dtype is cutlass.Float16 and regs64.mma_dtype is cutlass.Float16


def test_transposed_tma_refuses_64_token_tiles(monkeypatch):
    """A transposed launch of 64-token tiles read out of bounds under TMA on an H100 (Triton
    3.6), so it falls back to pointer loads; 32-token and rows-on-M launches keep TMA."""
    import torch

    from tokenspeed.mla import triton_decode

    monkeypatch.setattr(triton_decode, "tma_capable", lambda: True)
    cache = torch.empty(4, 64, 576, dtype=torch.bfloat16)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    assert triton_decode._tma_ok(cache, 64, 64) and triton_decode._tma_ok(cache, 32, 64, True)
    assert not triton_decode._tma_ok(cache, 64, 64, True)
