"""Paged GQA decode attention with split-KV, in Triton.

Grid: (request, KV head, split). A program loads the query heads of one KV group as a
``[BLOCK_H, D]`` tile (BLOCK_H >= 16 so ``tl.dot`` runs on tensor cores), streams its
split's share of the request's K/V once (``BLOCK_N`` tokens per step, gathered through
the block table, any page size), and keeps an online softmax. When the page size is a
multiple of ``BLOCK_N`` (page-block fast path) a tile never straddles a page: one block-table
lookup per tile and a contiguous ``[BLOCK_N, D]`` load, instead of a page id per token.
Whole tiles run without bounds masks; only a split's last, ragged tile is masked. With one split it writes
the output directly; with several it writes per-split partial outputs and log-sum-exps
that a merge kernel combines. Split boundaries come from each request's own length, so
short requests do not leave splits idle; the split count itself comes from shapes only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .common import dot_precision
from .configs import decode_default_config
from .paged_tiles import paged_kv_tile

_LOG2E = 1.4426950408889634


@triton.jit
def _decode_tile(
    acc, m_i, l_i, q, n0, end, b, kv_head,
    k_cache_ptr, v_cache_ptr, block_table_ptr,
    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt,
    qk_scale,
    MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr,
    head_dim: tl.constexpr, v_head_dim: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    """One ``BLOCK_N``-token step of the online softmax over tokens ``[n0, n0 + BLOCK_N)``."""
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    pos, tok_ok, k_rows, v_rows = paged_kv_tile(
        n0, end, b, kv_head, block_table_ptr, k_cache_ptr, v_cache_ptr,
        stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt,
        MASKED, PAGE_SIZE, BLOCK_N,
    )  # fmt: skip
    k = tl.load(
        k_rows[:, None] + d[None, :],
        mask=tok_ok[:, None] & (d[None, :] < head_dim),
        other=0.0,
    )
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # log2 domain
    if MASKED:
        scores = tl.where(tok_ok[None, :], scores, float("-inf"))
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
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, seq_lens_ptr,
    out_ptr, part_out_ptr, part_lse_ptr,
    qk_scale,
    group_size,
    stride_qb, stride_qh,
    stride_kp, stride_ks, stride_kh,
    stride_vp, stride_vs, stride_vh,
    stride_bt,
    stride_ob, stride_oh,
    stride_pb, stride_ph, stride_ps,
    stride_lb, stride_lh,
    head_dim: tl.constexpr, v_head_dim: tl.constexpr, PAGE_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    heads = kv_head * group_size + tl.arange(0, BLOCK_H)
    head_ok = tl.arange(0, BLOCK_H) < group_size
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)

    seq_len = tl.load(seq_lens_ptr + b)
    per_split = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)
    # Whole tiles need no bounds mask; at most one ragged tile is left at the end.
    full_end = tl.maximum(start + (end - start) // BLOCK_N * BLOCK_N, start)

    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=head_ok[:, None] & (d[None, :] < head_dim),
        other=0.0,
    )
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)

    for n0 in range(start, full_end, BLOCK_N):
        acc, m_i, l_i = _decode_tile(
            acc, m_i, l_i, q, n0, end, b, kv_head,
            k_cache_ptr, v_cache_ptr, block_table_ptr,
            stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt,
            qk_scale, False, DOT_PRECISION, head_dim, v_head_dim, PAGE_SIZE,
            BLOCK_N, BLOCK_D, BLOCK_DV,
        )  # fmt: skip
    for n0 in range(full_end, end, BLOCK_N):
        acc, m_i, l_i = _decode_tile(
            acc, m_i, l_i, q, n0, end, b, kv_head,
            k_cache_ptr, v_cache_ptr, block_table_ptr,
            stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt,
            qk_scale, True, DOT_PRECISION, head_dim, v_head_dim, PAGE_SIZE,
            BLOCK_N, BLOCK_D, BLOCK_DV,
        )  # fmt: skip

    has_tokens = l_i > 0
    out = acc / tl.where(has_tokens, l_i, 1.0)[:, None]
    out_mask = head_ok[:, None] & (dv[None, :] < v_head_dim)
    if NUM_SPLITS == 1:
        tl.store(
            out_ptr + b * stride_ob + heads[:, None] * stride_oh + dv[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=out_mask,
        )
    else:
        tl.store(
            part_out_ptr + b * stride_pb + heads[:, None] * stride_ph + split * stride_ps
            + dv[None, :],
            out,
            mask=out_mask,
        )  # fmt: skip
        lse = tl.where(has_tokens, m_i + tl.log2(tl.where(has_tokens, l_i, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=head_ok)


@triton.jit
def _decode_merge_kernel(
    part_out_ptr, part_lse_ptr, out_ptr,
    v_head_dim,
    stride_pb, stride_ph, stride_ps,
    stride_lb, stride_lh,
    stride_ob, stride_oh,
    NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    dv = tl.arange(0, BLOCK_DV)
    s_ok = s < NUM_SPLITS
    lse = tl.load(part_lse_ptr + b * stride_lb + h * stride_lh + s, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.where(s_ok & (lse > float("-inf")), tl.exp2(lse - m_safe), 0.0)
    parts = tl.load(
        part_out_ptr + b * stride_pb + h * stride_ph + s[:, None] * stride_ps + dv[None, :],
        mask=s_ok[:, None] & (dv[None, :] < v_head_dim),
        other=0.0,
    )
    total = tl.sum(w, axis=0)
    out = tl.sum(parts * w[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + dv, out.to(out_ptr.dtype.element_ty),
             mask=dv < v_head_dim)  # fmt: skip


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    config: Mapping[str, Any] | None = None,
) -> torch.Tensor:
    """Triton split-KV paged decode; see ``tokenspeed.kernels.paged_decode_attention``."""
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    v_head_dim = v_cache.shape[-1]
    group = num_q_heads // num_kv_heads
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("paged decode needs unit stride along head_dim")
    if config is None:
        page_size = k_cache.shape[1]
        config = decode_default_config(
            {
                "head_dim": head_dim,
                "batch": batch,
                "num_kv_heads": num_kv_heads,
                "kv_len": block_tables.shape[1] * page_size,
                "page_size": page_size,
            }
        )
    splits = int(config["num_splits"])
    out = torch.empty((batch, num_q_heads, v_head_dim), dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    block_dv = triton.next_power_of_2(v_head_dim)
    if splits > 1:
        part_out = torch.empty(
            (batch, num_q_heads, splits, block_dv), dtype=torch.float32, device=q.device
        )
        part_lse = torch.empty((batch, num_q_heads, splits), dtype=torch.float32, device=q.device)
    else:
        part_out, part_lse = out, out  # unused
    _decode_split_kernel[(batch, num_kv_heads, splits)](
        q, k_cache, v_cache, block_tables, seq_lens,
        out, part_out, part_lse,
        scale * _LOG2E,
        group,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        part_out.stride(0), part_out.stride(1), part_out.stride(2) if splits > 1 else 0,
        part_lse.stride(0), part_lse.stride(1),
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        PAGE_SIZE=k_cache.shape[1],
        NUM_SPLITS=splits,
        DOT_PRECISION=dot_precision(q.dtype),
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_N=int(config["block_n"]),
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_DV=block_dv,
        num_warps=int(config["num_warps"]),
        num_stages=int(config["num_stages"]),
    )  # fmt: skip
    if splits > 1:
        _decode_merge_kernel[(batch, num_q_heads)](
            part_out, part_lse, out,
            v_head_dim,
            part_out.stride(0), part_out.stride(1), part_out.stride(2),
            part_lse.stride(0), part_lse.stride(1),
            out.stride(0), out.stride(1),
            NUM_SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits), BLOCK_DV=block_dv,
            num_warps=4,
        )  # fmt: skip
    return out
