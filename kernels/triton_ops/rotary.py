"""Rotary embedding in place, neox (halves) and GPT-J (interleaved pairs) layouts.

One program per token rotates every head of q and k, so the token's cos/sin row is read
once. Only the first ``rot_dim`` dims of each head are touched (partial rotary).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .configs import warps_default_config


@triton.jit
def _rotate_heads(
    ptr, stride_t, stride_h, token, num_heads, cos, sin, half,
    IS_NEOX: tl.constexpr, BLOCK_HEADS: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    i = tl.arange(0, BLOCK_HALF)
    if IS_NEOX:
        first, second = i, i + half
    else:
        first, second = 2 * i, 2 * i + 1
    for h0 in range(0, num_heads, BLOCK_HEADS):
        heads = h0 + tl.arange(0, BLOCK_HEADS)
        mask = (heads[:, None] < num_heads) & (i[None, :] < half)
        base = ptr + token * stride_t + heads[:, None] * stride_h
        x1 = tl.load(base + first[None, :], mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(base + second[None, :], mask=mask, other=0.0).to(tl.float32)
        o1 = x1 * cos[None, :] - x2 * sin[None, :]
        o2 = x2 * cos[None, :] + x1 * sin[None, :]
        tl.store(base + first[None, :], o1.to(ptr.dtype.element_ty), mask=mask)
        tl.store(base + second[None, :], o2.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, pos_ptr, cache_ptr,
    num_q_heads, num_k_heads, half,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cache,
    IS_NEOX: tl.constexpr, BLOCK_HEADS: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    i = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cache_ptr + pos * stride_cache + i, mask=i < half, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * stride_cache + half + i, mask=i < half, other=0.0).to(
        tl.float32
    )
    _rotate_heads(q_ptr, stride_qt, stride_qh, token, num_q_heads, cos, sin, half,
                  IS_NEOX, BLOCK_HEADS, BLOCK_HALF)  # fmt: skip
    _rotate_heads(k_ptr, stride_kt, stride_kh, token, num_k_heads, cos, sin, half,
                  IS_NEOX, BLOCK_HEADS, BLOCK_HALF)  # fmt: skip


def apply_rotary_emb(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    *,
    config: Mapping[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton in-place rotary; see ``tokenspeed.kernels.apply_rotary_emb``."""
    if q.stride(-1) != 1 or k.stride(-1) != 1 or cos_sin_cache.stride(-1) != 1:
        raise ValueError("rotary needs unit stride along head_dim and in cos_sin_cache")
    tokens = q.shape[0]
    half = cos_sin_cache.shape[-1] // 2
    cfg = dict(config or warps_default_config({}))
    block_half = triton.next_power_of_2(half)
    block_heads = max(
        1, min(triton.next_power_of_2(max(q.shape[1], k.shape[1])), 2048 // block_half)
    )
    if tokens:
        _rotary_kernel[(tokens,)](
            q, k, positions, cos_sin_cache,
            q.shape[1], k.shape[1], half,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
            IS_NEOX=bool(is_neox), BLOCK_HEADS=block_heads, BLOCK_HALF=block_half,
            num_warps=cfg["num_warps"],
        )  # fmt: skip
    return q, k
