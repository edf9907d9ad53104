"""Paged extend (prefill over a cached prefix) attention, ragged batch, in Triton.

Flash-attention style: a program owns ``BLOCK_M`` new tokens of one request and one query
head and streams that request's K/V (prefix and new tokens alike, all read from the paged
cache) in ``BLOCK_N`` steps with an online softmax. With causal masking the K/V range is
split in two loops: tiles wholly before the first query's position need no mask; only the
diagonal tiles do. When the page size is a multiple of ``BLOCK_N`` each K/V tile sits inside
one page and is loaded with a single block-table lookup (page-block path).

Scores are kept in the log2 domain (``qk_scale = scale * log2(e)``, ``exp2``), the
accumulator in float32. The untuned default is the measured one (128x64 tiles, 8 warps, 3
stages for long prompts); the tuning space has the Hopper candidates (128x128, 3-4 stages).

The ragged batch is flattened into one grid axis of query blocks. Which request and which
of its blocks a grid index means is computed on the device (``_block_schedule``), from an
upper bound on the block count (``cdiv(T, BLOCK_M) + B``) so nothing is read back to the
host; indices past the real count exit at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .common import dot_precision
from .configs import extend_default_config
from .paged_tiles import paged_kv_tile

_LOG2E = 1.4426950408889634


@triton.jit
def _attend_tile(
    acc, m_i, l_i, q, n0, kv_len, q_pos, b,
    k_cache_ptr, v_cache_ptr, block_table_ptr, kv_head,
    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt,
    qk_scale,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
    head_dim: tl.constexpr, v_head_dim: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    pos, tok_ok, k_rows, v_rows = paged_kv_tile(
        n0, kv_len, b, kv_head, block_table_ptr, k_cache_ptr, v_cache_ptr,
        stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt,
        MASKED, PAGE_SIZE, BLOCK_N,
    )  # fmt: skip
    k = tl.load(
        k_rows[:, None] + d[None, :],
        mask=tok_ok[:, None] & (d[None, :] < head_dim),
        other=0.0,
    )
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    if MASKED:
        visible = tok_ok[None, :]
        if CAUSAL:
            visible = visible & (pos[None, :] <= q_pos[:, None])
        scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(scores - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(
        v_rows[:, None] + dv[None, :],
        mask=tok_ok[:, None] & (dv[None, :] < v_head_dim),
        other=0.0,
    )
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _extend_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, cu_seqlens_ptr, seq_lens_ptr,
    block_req_ptr, block_idx_ptr, out_ptr,
    qk_scale,
    group_size,
    stride_qt, stride_qh,
    stride_kp, stride_ks, stride_kh,
    stride_vp, stride_vs, stride_vh,
    stride_bt,
    stride_ot, stride_oh,
    head_dim: tl.constexpr, v_head_dim: tl.constexpr, PAGE_SIZE: tl.constexpr,
    CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    grid_block = tl.program_id(0)
    head = tl.program_id(1)
    b = tl.load(block_req_ptr + grid_block).to(tl.int64)
    if b >= 0:
        q_block = tl.load(block_idx_ptr + grid_block)
        kv_head = head // group_size
        q_start = tl.load(cu_seqlens_ptr + b)
        q_len = tl.load(cu_seqlens_ptr + b + 1) - q_start
        kv_len = tl.load(seq_lens_ptr + b)
        prefix = kv_len - q_len

        m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = m < q_len
        rows = (q_start + m).to(tl.int64)
        d = tl.arange(0, BLOCK_D)
        dv = tl.arange(0, BLOCK_DV)
        q = tl.load(
            q_ptr + rows[:, None] * stride_qt + head * stride_qh + d[None, :],
            mask=row_ok[:, None] & (d[None, :] < head_dim),
            other=0.0,
        )
        q_pos = prefix + m

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
        if CAUSAL:
            # Keys before the block's first query position are visible to every row.
            free_end = ((prefix + q_block * BLOCK_M) // BLOCK_N) * BLOCK_N
            kv_end = tl.minimum(kv_len, prefix + (q_block + 1) * BLOCK_M)
        else:
            free_end = (kv_len // BLOCK_N) * BLOCK_N
            kv_end = kv_len
        for n0 in range(0, free_end, BLOCK_N):
            acc, m_i, l_i = _attend_tile(
                acc, m_i, l_i, q, n0, kv_len, q_pos, b,
                k_cache_ptr, v_cache_ptr, block_table_ptr, kv_head,
                stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt,
                qk_scale, False, CAUSAL, DOT_PRECISION, head_dim, v_head_dim, PAGE_SIZE,
                BLOCK_N, BLOCK_D, BLOCK_DV,
            )  # fmt: skip
        for n0 in range(free_end, kv_end, BLOCK_N):
            acc, m_i, l_i = _attend_tile(
                acc, m_i, l_i, q, n0, kv_len, q_pos, b,
                k_cache_ptr, v_cache_ptr, block_table_ptr, kv_head,
                stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt,
                qk_scale, True, CAUSAL, DOT_PRECISION, head_dim, v_head_dim, PAGE_SIZE,
                BLOCK_N, BLOCK_D, BLOCK_DV,
            )  # fmt: skip
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + rows[:, None] * stride_ot + head * stride_oh + dv[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & (dv[None, :] < v_head_dim),
        )


def _block_schedule(
    cu_seqlens_q: torch.Tensor, num_tokens: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per grid index: its request (-1 past the end) and its block within the request.

    Device-side only: the grid has the static size ``cdiv(T, BLOCK_M) + B``, which bounds
    ``sum_b cdiv(q_len_b, BLOCK_M)``.
    """
    batch = cu_seqlens_q.numel() - 1
    q_lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).to(torch.int64)
    blocks = (q_lens + block_m - 1) // block_m
    ends = torch.cumsum(blocks, 0)
    grid = torch.arange(triton.cdiv(num_tokens, block_m) + batch, device=cu_seqlens_q.device)
    req = torch.searchsorted(ends, grid, right=True)
    valid = req < batch
    req_safe = req.clamp(max=batch - 1)
    idx = grid - (ends[req_safe] - blocks[req_safe])
    return torch.where(valid, req, -1).to(torch.int32), idx.to(torch.int32)


def paged_extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    causal: bool = True,
    *,
    config: Mapping[str, Any] | None = None,
) -> torch.Tensor:
    """Triton ragged paged extend attention; see ``tokenspeed.kernels.paged_extend_attention``."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    v_head_dim = v_cache.shape[-1]
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("paged extend needs unit stride along head_dim")
    cfg = dict(config or extend_default_config({"num_tokens": num_tokens, "head_dim": head_dim}))
    out = torch.empty((num_tokens, num_q_heads, v_head_dim), dtype=q.dtype, device=q.device)
    batch = cu_seqlens_q.numel() - 1
    if num_tokens == 0 or batch == 0:
        return out
    block_m = int(cfg["block_m"])
    block_req, block_idx = _block_schedule(cu_seqlens_q, num_tokens, block_m)
    grid = (block_req.numel(), num_q_heads)
    _extend_kernel[grid](
        q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens,
        block_req, block_idx, out,
        scale * _LOG2E,
        num_q_heads // num_kv_heads,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        head_dim=head_dim, v_head_dim=v_head_dim, PAGE_SIZE=k_cache.shape[1],
        CAUSAL=bool(causal), DOT_PRECISION=dot_precision(q.dtype),
        BLOCK_M=block_m, BLOCK_N=int(cfg["block_n"]),
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_DV=triton.next_power_of_2(v_head_dim),
        num_warps=int(cfg["num_warps"]),
        num_stages=int(cfg["num_stages"]),
    )  # fmt: skip
    return out
