"""Storing new K/V into the paged caches: one program per token, negative slots skipped."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .configs import warps_default_config


@triton.jit
def _copy_token(
    src_ptr, dst_ptr, token, page, offset, num_heads, head_dim,
    stride_st, stride_sh, stride_dp, stride_ds, stride_dh,
    BLOCK_HEADS: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    d = tl.arange(0, BLOCK_D)
    for h0 in range(0, num_heads, BLOCK_HEADS):
        heads = h0 + tl.arange(0, BLOCK_HEADS)
        mask = (heads[:, None] < num_heads) & (d[None, :] < head_dim)
        vals = tl.load(
            src_ptr + token * stride_st + heads[:, None] * stride_sh + d[None, :], mask=mask
        )
        dst = (
            dst_ptr
            + page * stride_dp
            + offset * stride_ds
            + heads[:, None] * stride_dh
            + d[None, :]
        )
        tl.store(dst, vals.to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    num_heads, head_dim, v_head_dim, page_size,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcp, stride_kcs, stride_kch, stride_vcp, stride_vcs, stride_vch,
    BLOCK_HEADS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot >= 0:
        page = slot // page_size
        offset = slot % page_size
        _copy_token(k_ptr, k_cache_ptr, token, page, offset, num_heads, head_dim,
                    stride_kt, stride_kh, stride_kcp, stride_kcs, stride_kch, BLOCK_HEADS, BLOCK_D)  # fmt: skip
        _copy_token(v_ptr, v_cache_ptr, token, page, offset, num_heads, v_head_dim,
                    stride_vt, stride_vh, stride_vcp, stride_vcs, stride_vch, BLOCK_HEADS, BLOCK_DV)  # fmt: skip


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    config: Mapping[str, Any] | None = None,
) -> None:
    """Triton paged K/V store; see ``tokenspeed.kernels.store_kv``."""
    if k.stride(-1) != 1 or v.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("store_kv needs unit stride along head_dim")
    tokens, num_heads, head_dim = k.shape
    v_head_dim = v.shape[-1]
    if not tokens:
        return
    cfg = dict(config or warps_default_config({}))
    block_d = triton.next_power_of_2(head_dim)
    block_dv = triton.next_power_of_2(v_head_dim)
    block_heads = max(1, min(triton.next_power_of_2(num_heads), 4096 // max(block_d, block_dv)))
    _store_kv_kernel[(tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        num_heads, head_dim, v_head_dim, k_cache.shape[1],
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        BLOCK_HEADS=block_heads, BLOCK_D=block_d, BLOCK_DV=block_dv,
        num_warps=cfg["num_warps"],
    )  # fmt: skip
