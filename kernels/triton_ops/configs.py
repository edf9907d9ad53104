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
    """Split-KV count from batch, KV heads and context length (shapes only, no tensor reads).

    Aim at about ``per_sm`` programs per SM. On the H200 (2026-11-29) 4 per SM beat 8 and 16
    (Llama-3-8B shapes: 87.8% vs 84.6% of copy bandwidth at 64 x 2k, 93.3% vs 82.4% at
    16 x 8k): more splits cost more in the merge than they gain in the tail. Never split below
    256 tokens per split, nor beyond 32 splits.
    """
    programs = max(1, traits["batch"] * traits["num_kv_heads"])
    target = per_sm * (sms or num_sms())
    want = -(-target // programs)
    return _clamp(want, 1, _clamp(traits["kv_len"] // 256, 1, 32))


def decode_default_config(traits: Traits) -> Config:
    """64-token tiles (page-aligned when the page size allows, see the page-block fast
    path), 4 warps, 2 stages, ~4 programs per SM: the fastest of the configurations measured
    on the H200 (3 and 4 stages, 8 warps, 32- and 128-token tiles were all slower there)."""
    head_dim = traits["head_dim"]
    return {
        "block_n": 64 if head_dim <= 128 else 32,
        "num_warps": 4,
        "num_stages": 2,
        "num_splits": decode_num_splits(traits),
    }


def decode_config_space(traits: Traits) -> list[Config]:
    base = decode_num_splits(traits)
    splits = sorted({s for s in (1, base // 4, base // 2, base, base * 2) if 1 <= s <= 64})
    return _grid(
        block_n=[16, 32, 64, 128],
        num_warps=[4, 8],
        num_stages=[2, 3, 4],
        num_splits=splits,
    )


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


def moe_default_config(traits: Traits) -> Config:
    """By shape bucket of the routed pairs (``tokens * top_k``) per expert.

    Few tokens per expert is a weight-streaming problem: every touched expert's weights are
    read once whatever the block sizes, so what matters is how many programs share that
    read. ``block_n`` 32 doubles the gate/up programs (and halves each one's stream) over
    64, and the down projection (K = intermediate, usually short) keeps 64-wide N tiles with
    the full K in 1-2 steps. With many tokens per expert the GEMMs become compute bound and
    want big tiles.
    """
    pairs = traits["num_tokens"] * traits["top_k"]
    per_expert = pairs / max(1, traits["num_experts"])
    if per_expert <= 16 and pairs <= 64:
        # Decode-sized batches (1-8 tokens at top-8): spread each expert over many programs.
        return {
            "block_m": 16, "block_n": 32, "block_k": 128, "num_warps": 4, "num_stages": 4,
            "down_block_n": 64, "down_block_k": 128,
        }  # fmt: skip
    if per_expert <= 16:
        return {"block_m": 16, "block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 3}
    if per_expert <= 64:
        return {"block_m": 32, "block_n": 64, "block_k": 64, "num_warps": 4, "num_stages": 3}
    return {"block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 3}


def moe_config_space(traits: Traits) -> list[Config]:
    per_expert = traits["num_tokens"] * traits["top_k"] / max(1, traits["num_experts"])
    ms = [16, 32] if per_expert <= 16 else [16, 32, 64, 128]
    ns = [16, 32, 64] if per_expert <= 16 else [32, 64, 128]
    return _grid(
        block_m=ms,
        block_n=ns,
        block_k=[64, 128],
        num_warps=[4, 8],
        num_stages=[2, 3, 4],
    )
