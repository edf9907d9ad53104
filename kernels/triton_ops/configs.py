"""Launch configurations of the Triton kernels: the untuned defaults and the tuning spaces.

Pure Python (no Triton import): the selector asks for a default config when it picks a
kernel, and ``tokenspeed tune-kernels`` enumerates the spaces. Every function takes the
op's shape traits (see ``tokenspeed.kernels.ops``) and nothing read from tensor values.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping
from typing import Any

Traits = Mapping[str, Any]
Config = dict[str, Any]


def _pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def _clamp(v: int, low: int, high: int) -> int:
    return max(low, min(high, v))


@functools.cache
def num_sms() -> int:
    """Streaming multiprocessors of the current GPU (a small stand-in on CPU)."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return 8


def _grid(**axes: list[Any]) -> list[Config]:
    keys = list(axes)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*axes.values())]


# -- norms -----------------------------------------------------------------------------------


def norm_default_config(traits: Traits) -> Config:
    """One row per program for model-sized rows; several short rows (per-head norms) per program."""
    block_h = _pow2(traits["hidden"])
    block_rows = 1 if block_h >= 1024 else _clamp(2048 // block_h, 1, 16)
    return {"block_rows": block_rows, "num_warps": _clamp(block_h * block_rows // 512, 1, 16)}


def norm_config_space(traits: Traits) -> list[Config]:
    block_h = _pow2(traits["hidden"])
    rows = [1] if block_h >= 4096 else [1, 2, 4, 8, 16]
    return [
        c
        for c in _grid(block_rows=rows, num_warps=[1, 2, 4, 8, 16])
        if c["num_warps"] * 32 <= block_h * c["block_rows"]
    ]


# -- activation ------------------------------------------------------------------------------


def silu_default_config(traits: Traits) -> Config:
    return {"block_n": _clamp(_pow2(traits["intermediate"]), 128, 1024), "num_warps": 4}


def silu_config_space(traits: Traits) -> list[Config]:
    top = _pow2(traits["intermediate"])
    return [
        c
        for c in _grid(block_n=[256, 512, 1024, 2048, 4096], num_warps=[2, 4, 8])
        if c["block_n"] <= max(top, 256)
    ]


# -- rotary, store_kv, routing: only the warp count matters ----------------------------------


def warps_default_config(traits: Traits) -> Config:
    return {"num_warps": 4}


def warps_config_space(traits: Traits) -> list[Config]:
    return _grid(num_warps=[1, 2, 4, 8])


def route_default_config(traits: Traits) -> Config:
    return {"num_warps": 1 if traits["num_experts"] <= 64 else 4}


# -- paged decode attention ------------------------------------------------------------------


def decode_num_splits(traits: Traits, sms: int | None = None, per_sm: int = 4) -> int:
    """Split-KV count aiming at about ``per_sm`` programs per SM (shapes only, no tensor reads).

    The split rule of the previous default, kept for head dims above 128 (no H200 data there)
    and as a point of the tuning space. Never below 256 tokens per split, nor beyond 32 splits.
    """
    programs = max(1, traits["batch"] * traits["num_kv_heads"])
    target = per_sm * (sms or num_sms())
    want = -(-target // programs)
    return _clamp(want, 1, _clamp(traits["kv_len"] // 256, 1, 32))


def decode_wave_splits(
    traits: Traits, ctas_per_sm: int, sms: int | None = None, block_n: int = 64
) -> int:
    """Split-KV count that keeps the whole grid in one wave of resident programs.

    ``ctas_per_sm`` is the compiled kernel's occupancy (registers, shared memory). Every
    program of a decode streams the same bytes, and per-program bandwidth is capped by its
    own loads in flight, so a grid of 1.55 waves (the 4-per-SM default at 64 x 2k: 1024
    programs on 660 slots) runs its last 0.55 wave at part speed. Here the count is the
    fewest splits that reach the shortest per-program tile count possible in one wave.
    """
    slots = max(1, ctas_per_sm) * (sms or num_sms())
    pairs = max(1, traits["batch"] * traits["num_kv_heads"])
    most = _clamp(slots // pairs, 1, _clamp(traits["kv_len"] // 256, 1, 32))
    tiles = max(1, -(-traits["kv_len"] // block_n))
    per_split = -(-tiles // most)
    return -(-tiles // per_split)


# Resident programs per SM of the default decode kernels on the H200 (sm_90a, Triton 3.6; the
# compiled registers and shared memory the sweep records): TMA n64 s2 121-125 registers and
# 55 KB -> 4; n32 s3 with carried page ids, 80-104 registers and 38 KB -> 4.
DECODE_CTAS_PER_SM = {"tma": 4, "carry": 4}
# One program per (request, KV head) with 128-token tiles once those programs alone fill at
# least this share of the SMs and each streams at least this many tokens (16 x 8k, 8 KV
# heads, page 16 on the H200, 2026-12-02: 130.9-135.6 us over four runs against 135.3-137.5
# us for the split plan; four warps measured the same, 133.6-134.1 us, with 168 registers).
DECODE_GROUPS_FILL = 0.9
DECODE_GROUPS_MIN_KV = 4096


def decode_groups_fill_sms(traits: Traits, sms: int | None = None) -> bool:
    """Whether one program per (request, KV head) nearly fills one wave of single programs.

    Then splitting buys no parallelism the SMs lack; it only adds partial outputs and a
    merge at the end, and one wide program per SM (128-token tiles, 3 stages, 8 warps, one
    per SM by shared memory) streams its group's cache without that tail. (Equal tile shares
    over all SMs, groups cut between programs, measured 5-17 % slower in its best forms on
    the H200: docs/performance.md.)
    """
    groups = traits["batch"] * traits["num_kv_heads"]
    sms = sms or num_sms()
    return DECODE_GROUPS_FILL * sms <= groups <= sms and traits["kv_len"] >= DECODE_GROUPS_MIN_KV


def decode_default_config(traits: Traits, sms: int | None = None) -> Config:
    """The fastest decode plan of the H200 sweep (2026-12-01, Llama-3-8B heads), by shape.

    - page size a multiple of 64: TMA page-block tiles, 64 tokens, 2 stages, split count
      from one wave at 4 programs per SM (99.1% of copy bandwidth at 64 x 2k, 95.8% at 16 x 8k);
    - other page sizes (16): when the (request, KV head) groups alone nearly fill the SMs once
      with long contexts (``decode_groups_fill_sms``), one program each with 128-token tiles,
      3 stages, 8 warps and the page ids carried one tile ahead (93.4-96.3% at 16 x 8k over
      four runs, 2026-12-02); otherwise 32-token tiles at 3 stages with carried page ids,
      split for one wave at 4 per SM (91.3-93.5% at 16 x 8k), which is one split when the
      groups already fill that wave (93.4-96.9% at 64 x 2k over six runs, 2026-12-01/02,
      against 92.5-94.5% for 64-token tiles at 2 stages in the same runs);
    - several splits are merged by the last split to finish (``merge: "fused"``), as measured.

    Head dims above 128 keep the previous plan (32-token tiles, ~4 programs per SM): the
    sweep has no data there, and 64-token TMA tiles of 256-wide heads would not fit 4 per SM.
    ``sms`` defaults to the current GPU's count.
    """
    head_dim = max(traits["head_dim"], traits.get("v_head_dim", traits["head_dim"]))
    if head_dim > 128:
        return {"block_n": 32, "num_warps": 4, "num_stages": 2,
                "num_splits": decode_num_splits(traits, sms)}  # fmt: skip
    if traits["page_size"] % 64 == 0:
        splits = decode_wave_splits(traits, DECODE_CTAS_PER_SM["tma"], sms)
        cfg = {"block_n": 64, "num_warps": 4, "num_stages": 2, "num_splits": splits, "tma": True}
    elif decode_groups_fill_sms(traits, sms):
        cfg = {"block_n": 128, "num_warps": 8, "num_stages": 3, "num_splits": 1,
               "carry_pages": True}  # fmt: skip
    else:
        splits = decode_wave_splits(traits, DECODE_CTAS_PER_SM["carry"], sms, block_n=32)
        cfg = {"block_n": 32, "num_warps": 4, "num_stages": 3, "num_splits": splits,
               "carry_pages": True}  # fmt: skip
    if cfg["num_splits"] > 1:
        cfg["merge"] = "fused"
    return cfg


def decode_config_space(traits: Traits) -> list[Config]:
    """Tile, stages, warps, split count, tile loads (pointer gather, carried page ids, TMA
    where the page holds whole tiles) and the split merge (second launch or fused).

    The default comes first; split counts are 1, the one-wave counts at 3-5 programs per SM
    and the previous ~4-per-SM rule.
    """
    page = traits["page_size"]
    space = [decode_default_config(traits)]
    for block_n in (16, 32, 64, 128):
        waves = {decode_wave_splits(traits, ctas, block_n=block_n) for ctas in (3, 4, 5)}
        splits = sorted({1, decode_num_splits(traits), *waves})
        loads = [{}, {"carry_pages": True}] + ([{"tma": True}] if page % block_n == 0 else [])
        warps_options = (4, 8) if block_n >= 64 else (4,)  # 8 warps on a 16-row dot: idle
        for load, stages, warps, num_splits in itertools.product(
            loads, (2, 3, 4), warps_options, splits
        ):
            base = {"block_n": block_n, "num_warps": warps, "num_stages": stages,
                    "num_splits": num_splits, **load}  # fmt: skip
            merges = ({}, {"merge": "fused"}) if num_splits > 1 else ({},)
            space += [c for c in ({**base, **m} for m in merges) if c not in space]
    return space


# -- paged extend attention ------------------------------------------------------------------


def extend_default_config(traits: Traits) -> Config:
    block_m = _clamp(_pow2(traits["num_tokens"]), 16, 128)
    big = block_m >= 128 and traits["head_dim"] <= 128
    return {
        "block_m": block_m,
        "block_n": 64,
        "num_warps": 8 if big else 4,
        "num_stages": 3 if big else 2,
    }


def extend_config_space(traits: Traits) -> list[Config]:
    """Includes the Hopper shapes (128x128 tiles, 8 warps, 3-4 stages) tuning should try."""
    return [
        c
        for c in _grid(
            block_m=[64, 128], block_n=[32, 64, 128], num_warps=[4, 8], num_stages=[2, 3, 4]
        )
        if c["block_m"] <= max(16, _pow2(traits["num_tokens"]))
    ]


def sdpa_extend_default_config(traits: Traits) -> Config:
    """Native GQA (`enable_gqa=True`): on the H200 with torch 2.11 it ran at 548 TFLOP/s
    causal against 494 for repeating KV heads in the gather (16k tokens, 32/8 heads, hd 128),
    and it never copies the expanded K/V."""
    return {"gqa": "native" if traits.get("group_size", 1) > 1 else "expand"}


def sdpa_extend_config_space(traits: Traits) -> list[Config]:
    return _grid(gqa=["expand", "native"])


# -- fused MoE -------------------------------------------------------------------------------

# The sort-free tile holds one row per token (at least 16): past 16 tokens most of its rows
# are masked, and it lost to the sorted path at 32 tokens (73.8% against 93.1%).
MOE_SORTFREE_MAX_TOKENS = 16
# The one-pass MoE (fused_moe_onepass.py) is the default up to this many tokens; it holds
# weight tiles of [block_i, next_pow2(hidden)] elements, at most MOE_ONEPASS_MAX_TILE.
MOE_ONEPASS_MAX_TOKENS = 4
MOE_ONEPASS_MAX_TILE = 16384
# The single-program Triton alignment and the Triton top-k sum were measured up to 256 tokens
# at top-8 (2048 pairs); past that the GEMMs dominate and the torch ops stay.
MOE_TRITON_ALIGN_MAX_PAIRS = 2048


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def moe_default_config(traits: Traits) -> Config:
    """By token count, expert sharing and how ``w2`` is stored; the H200 sweeps' winners
    (Qwen3-30B-A3B: 128 experts, top-8, hidden 2048, intermediate 768).

    - ``w2`` contiguous along H (``[E, I, H]`` storage, the runtime's; 2026-12-02): the one-pass
      kernel up to 4 tokens, the sorted path with Triton align + sum up to 16, then as below.
    - Otherwise, at most 16 tokens: the sort-free path (no alignment; one program row per pair, the
      expert's first pair runs its tile). While tokens rarely share an expert (pairs <= half
      the experts: 1-8 tokens at 128/top-8) the down projection runs token-major as a GEMV
      over each token's experts, which writes the output rows directly (63.8% / 79.4% /
      82.9% / 86.0% of copy bandwidth at 1 / 2 / 4 / 8 tokens; 64.2% at 1 token with six
      stages in the down GEMV, 2026-12-02); with more sharing it runs
      expert-major plus a Triton top-k sum (90.8% at 16 tokens).
    - More tokens: the sorted path with the one-launch Triton alignment and top-k sum (93.1% /
      94.0% / 92.9% at 32 / 64 / 128 tokens); 32-row tiles from 16 routed pairs per expert on
      (86.8% at 256 tokens against 85.8% for 16 rows). Big buckets become compute bound and
      want big tiles.
    """
    tokens, top_k = traits["num_tokens"], traits["top_k"]
    pairs = tokens * top_k
    experts = max(1, traits["num_experts"])
    per_expert = pairs / experts
    if traits.get("w2_contiguous") == "hidden" and tokens <= MOE_SORTFREE_MAX_TOKENS:
        # w2 stored [E, I, H] (the runtime's FusedMoE): one launch over both projections up
        # to MOE_ONEPASS_MAX_TOKENS (H200, 2026-12-02: 1 token 23.8-26.2 us over four runs
        # against 26.5-27.7 us for the two launches below on [E, H, I]; 2 tokens 42.2-42.5
        # against 44.5-44.9; 4 tokens 79.7-80.9, where [E, H, I] gave 76.1-77.8); then the
        # sorted path with few launches (the token-major down GEMV wants [E, H, I]).
        # Warps (eleventh session, four runs): 4 at one token, where the down rows then
        # accumulate per row (22.6-22.9 us against 23.1-24.1 with 8 warps; 25.8-25.9 with 4
        # warps and no per-row sums) and at 4 tokens (76.9-77.3 against 80.0-80.8 us); 8 at 2
        # tokens (41.1-41.5 against 48.0-48.2 us); 3 tokens share 4's tile shapes.
        fits = _pow2_at_least(int(traits.get("hidden", 0))) <= MOE_ONEPASS_MAX_TILE
        if tokens <= MOE_ONEPASS_MAX_TOKENS and fits:
            return {"path": "onepass", "num_warps": 8 if tokens == 2 else 4, "num_stages": 3}
        return {"block_m": 16, "block_n": 32, "block_k": 128, "num_warps": 4, "num_stages": 4,
                "down_block_n": 64, "down_block_k": 128, "align": "triton", "reduce": "triton"}  # fmt: skip
    if tokens <= MOE_SORTFREE_MAX_TOKENS:  # one 16-row tile holds every token
        if 2 * pairs <= experts:
            # One token: six stages in the down GEMV (27.5-27.6 us against 28.3-30.4 us with
            # four, four H200 runs on 2026-12-02; no better from 2 tokens on).
            return {
                "path": "sortfree", "down": "token", "block_m": 16, "block_n": 32, "block_k": 128,
                "num_warps": 4, "num_stages": 4, "down_block_n": 16, "down_block_k": 256,
                "down_num_warps": 4, "down_num_stages": 6 if tokens == 1 else 4,
            }  # fmt: skip
        return {
            "path": "sortfree", "reduce": "triton", "block_m": 16,
            "block_n": 16 if tokens <= 4 else 32, "block_k": 128, "num_warps": 4,
            "num_stages": 4, "down_block_n": 32, "down_block_k": 128,
        }  # fmt: skip
    fewer = {"align": "triton", "reduce": "triton"} if pairs <= MOE_TRITON_ALIGN_MAX_PAIRS else {}
    if per_expert < 16:
        tiles = {"block_m": 16, "block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 3}
    elif per_expert <= 64:
        tiles = {"block_m": 32, "block_n": 64, "block_k": 64, "num_warps": 4, "num_stages": 3}
    else:
        tiles = {"block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 3}
    return {**tiles, **fewer}


def moe_config_space(traits: Traits) -> list[Config]:
    """The sorted path's tiles (with the Triton alignment and top-k sum where measured), and
    for small batches the sort-free path with either down projection. The default first."""
    tokens, top_k = traits["num_tokens"], traits["top_k"]
    per_expert = tokens * top_k / max(1, traits["num_experts"])
    fewer = {"align": "triton", "reduce": "triton"}
    if tokens * top_k > MOE_TRITON_ALIGN_MAX_PAIRS:
        fewer = {}
    ms = [16, 32] if per_expert <= 16 else [16, 32, 64, 128]
    ns = [16, 32, 64] if per_expert <= 16 else [32, 64, 128]
    space = [moe_default_config(traits)]
    hidden_rows = traits.get("w2_contiguous") == "hidden"
    width = _pow2_at_least(int(traits.get("hidden", 0)))
    if hidden_rows and tokens <= 8 and width <= MOE_ONEPASS_MAX_TILE:  # needs w2 [E, I, H]
        rows = [r for r in (1, 2, 4) if r * width <= MOE_ONEPASS_MAX_TILE]
        space += [{"path": "onepass", **c} for c in _grid(block_i=rows, num_warps=[4, 8],
                                                            num_stages=[3, 4])]  # fmt: skip
    if tokens <= MOE_SORTFREE_MAX_TOKENS:
        gate_up = _grid(block_m=[16], block_n=[16, 32, 64], block_k=[128], num_warps=[4],
                        num_stages=[3, 4])  # fmt: skip
        token_down = _grid(down_block_n=[8, 16, 32], down_block_k=[128, 256, 512],
                           down_num_warps=[4], down_num_stages=[4, 6])  # fmt: skip
        expert_down = _grid(down_block_n=[32, 64], down_block_k=[128])
        if not hidden_rows:  # its GEMV tiles read W2 rows along I
            space += [{"path": "sortfree", "down": "token", **g, **d}
                      for g in gate_up for d in token_down]  # fmt: skip
        space += [{"path": "sortfree", "reduce": "triton", **g, **d}
                  for g in gate_up for d in expert_down]  # fmt: skip
    tiles = _grid(block_m=ms, block_n=ns, block_k=[64, 128], num_warps=[4, 8],
                  num_stages=[2, 3, 4])  # fmt: skip
    space += [{**c, **fewer} for c in tiles]
    return [c for i, c in enumerate(space) if c not in space[:i]]
