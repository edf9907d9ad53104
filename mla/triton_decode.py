"""Absorbed-MLA decode over the paged latent cache, in Triton: split-KV + a merge kernel.

Grid of the main kernel: (row block, KV split, request), row blocks fastest. A *row* is one
(query token, head) pair; ``fold`` query tokens x all heads form a row group, cut into
blocks of ``BLOCK_H`` rows (64 by default). One program owns one row block of one request
and streams its split of that request's latent cache once, ``BLOCK_N`` tokens per step:

* ``s = q_c @ kv_c^T + q_r @ k_r^T`` over the 512 compressed + 64 rope dims (two ``tl.dot``s,
  both tiles loaded once; Triton keeps them in shared memory for both products),
* online softmax in the exp2 domain with the causal mask of the query block,
* ``acc += p @ kv_c``: V is the same 512-dim tile, so no second read.

All rows of a block share every KV tile, so the cache is read from HBM once per 64 rows;
row blocks of the same request are adjacent in the grid and share tiles through L2. The
``[BLOCK_H, 512]`` fp32 accumulator lives in registers, split over the warps (at 8 warps and
64 rows: 128 registers per thread). With one split the kernel writes the output (and LSE)
directly; otherwise fp32 partials and base-2 LSEs go to the workspace and the merge kernel
combines them. Split boundaries follow each request's own length (read on the device), the
split count itself comes from shapes only, so the launch is CUDA-graph safe.

Two layouts of the products (``TOKENS_ON_M``, plan key ``tokens_on_m``): rows on M, as
above, or transposed, ``s^T = kv @ q^T`` and ``o^T += kv_c^T @ p^T``, with the KV tokens and
output dims on the MMA's M axis and the rows on N. The plan takes the transposed layout for
32-row blocks, where it measured 1.4x faster on an H100 (rows on M leave Hopper's ``wgmma``
unused below 64 rows); 16- and 64-row blocks keep rows on M, which measured faster there
(docs/mla.md).

Two programs load the tiles: ``_mla_decode_split_kernel`` gathers every tile by pointer
loads; ``_mla_decode_split_kernel_tma`` (plan key ``tma``) fetches every whole tile by TMA
(on Hopper and newer, when a tile fits in a page): no per-token address tensors, so 64-row
blocks take 64-token tiles without spilling, 1.6x faster than pointer loads at 64 and 128
heads on an H100; the plan takes it where the GPU and the page size allow, except for the
transposed 32-row blocks over an FP8 cache (docs/mla.md). Both share the tile math
(``_attend_tile``) and the epilogue (``_write_rows``) of either layout.

FP8 caches are widened in registers to f16 for an f16 query, and for a bf16 one in blocks of
up to 32 rows (one conversion per pair of values; to bf16 it takes four; 0.68-0.89x the time
of bf16 products at 16 and 32 heads on an H200): the kernel converts the query to f16
scaled by 2^-4 (``Q_F16_SCALE``) and scales the scores back. In 64-row blocks a bf16 query
keeps bf16 products (converted there, the query is held in registers and the launch
spills); a float32 query takes float32 products. A per-tensor scale folds into the softmax
scale and the output; per-token scales multiply the scores, and with f16 products enter
``p`` relative to the largest scale seen so far (``_value_scales``), which keeps ``p``
within [0, 1] and away from f16's subnormals however small the cache's scales.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .configs import plan_decode, tma_capable

_LOG2E = 1.4426950408889634

SCALE_NONE, SCALE_TENSOR, SCALE_TOKEN = 0, 1, 2

# A bf16 query over an FP8 cache is scaled by 2^-4 into f16's range (to ~1e6), as in the
# CuTe kernels (mla/fp8_widen.py); the scores undo it in float32. The kernels take the factor
# as a run-time argument: as a constant, the compiler narrowed ``(q.to(f32) * 2^-4).to(f16)``
# to an f16 multiply after the conversion, where a query past 65504 overflows first.
Q_F16_SCALE = 2.0**-4


@triton.jit
def _rope_mask(rows_ok, r_ok, PADDED: tl.constexpr):
    """The load mask of a rope tile: rows, and the padded columns only when there are any."""
    mask = rows_ok[:, None]
    if PADDED:
        mask = mask & r_ok[None, :]
    return mask


@triton.jit
def _load_q(q_ptr, q_off, row_ok, dv, dr, r_ok, DV: tl.constexpr, PADDED: tl.constexpr,
            TOKENS_ON_M: tl.constexpr):  # fmt: skip
    """A row block's query: ``[rows, dims]``, or ``[dims, rows]`` (the B operand) when the KV
    tokens sit on M."""
    if TOKENS_ON_M:
        q_c = tl.load(q_ptr + q_off[None, :] + dv[:, None], mask=row_ok[None, :], other=0.0)
        q_r = tl.load(q_ptr + q_off[None, :] + DV + dr[:, None],
                      mask=tl.trans(_rope_mask(row_ok, r_ok, PADDED)), other=0.0)  # fmt: skip
    else:
        q_c = tl.load(q_ptr + q_off[:, None] + dv[None, :], mask=row_ok[:, None], other=0.0)
        q_r = tl.load(q_ptr + q_off[:, None] + DV + dr[None, :],
                      mask=_rope_mask(row_ok, r_ok, PADDED), other=0.0)  # fmt: skip
    return q_c, q_r


@triton.jit
def _attend_tile(
    q_c, q_r, kv_c, k_r, tok_scale_ptrs, pos, tok_ok, q_pos, m_i, l_i, acc, v_scale, scale,
    SCALE_MODE: tl.constexpr, DOT_PRECISION: tl.constexpr, TOKENS_ON_M: tl.constexpr,
    P_RELATIVE: tl.constexpr,
):  # fmt: skip
    """One KV tile into a row block's online softmax: scores, mask, rescale, P @ V.

    Rows on M: ``s = q @ kv^T``, ``acc[rows, 512] += p @ kv_c``. Tokens on M (the query
    transposed by ``_load_q``): ``s^T = kv @ q^T``, ``acc[512, rows] += kv_c^T @ p^T``, so
    the tile's tokens and the output dims sit on the MMA's M axis and both operands of both
    products can come from shared memory (Hopper's ``wgmma`` needs 64 on M per warp group,
    which rows on M only reach at 64 rows). ``tok_scale_ptrs`` address the tile's per-token
    scales (read only when SCALE_MODE is 2).

    With f16 products (``P_RELATIVE``) per-token scales enter ``p`` relative to ``v_scale``,
    the largest scale seen so far (the output is ``acc * v_scale``): ``p * s / v_scale``
    stays within [0, 1], so the products keep f16's precision however small the scales.
    """
    if TOKENS_ON_M:
        s = tl.dot(kv_c, q_c, input_precision=DOT_PRECISION)  # [BLOCK_N, BLOCK_H]
        s = tl.dot(k_r, q_r, acc=s, input_precision=DOT_PRECISION)
        if SCALE_MODE == 2:
            tok_scale = tl.load(tok_scale_ptrs, mask=tok_ok, other=0.0)
            s = s * (tok_scale[:, None] * scale)
        else:
            s = s * scale
        visible = tok_ok[:, None] & (pos[:, None] <= q_pos[None, :])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[None, :])
        l_i = l_i * alpha + tl.sum(p, axis=0)
        alpha_o = alpha
        if SCALE_MODE == 2:
            if P_RELATIVE:
                p_scale, alpha_o, v_scale = _value_scales(tok_scale, v_scale, alpha)
                p = p * p_scale[:, None]
            else:
                p = p * tok_scale[:, None]
        acc = acc * alpha_o[None, :] + tl.dot(tl.trans(kv_c), p.to(kv_c.dtype),
                                              input_precision=DOT_PRECISION)  # fmt: skip
    else:
        s = tl.dot(q_c, tl.trans(kv_c), input_precision=DOT_PRECISION)
        s = tl.dot(q_r, tl.trans(k_r), acc=s, input_precision=DOT_PRECISION)
        if SCALE_MODE == 2:
            tok_scale = tl.load(tok_scale_ptrs, mask=tok_ok, other=0.0)
            s = s * (tok_scale[None, :] * scale)
        else:
            s = s * scale
        visible = tok_ok[None, :] & (pos[None, :] <= q_pos[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        alpha_o = alpha
        if SCALE_MODE == 2:
            if P_RELATIVE:
                p_scale, alpha_o, v_scale = _value_scales(tok_scale, v_scale, alpha)
                p = p * p_scale[None, :]
            else:
                p = p * tok_scale[None, :]
        acc = acc * alpha_o[:, None] + tl.dot(p.to(kv_c.dtype), kv_c,
                                              input_precision=DOT_PRECISION)  # fmt: skip
    return m_new, l_i, acc, v_scale


@triton.jit
def _value_scales(tok_scale, v_scale, alpha):
    """A tile's per-token scales relative to the largest seen so far: ``p``'s factor, the
    output's rescale (``alpha`` times the old largest over the new) and the new largest."""
    v_new = tl.maximum(v_scale, tl.max(tok_scale, axis=0))
    inv_v = tl.where(v_new > 0.0, 1.0 / tl.where(v_new > 0.0, v_new, 1.0), 0.0)
    return tok_scale * inv_v, alpha * (v_scale * inv_v), v_new


@triton.jit
def _write_rows(
    acc, m_i, l_i, out_scale, v_scale, b, t, h, row_ok, split,
    out_ptr, lse_ptr, part_out_ptr, part_lse_ptr, num_heads, q_len, stride_ob, stride_ot, stride_oh,
    DV: tl.constexpr, NUM_SPLITS: tl.constexpr, WRITE_LSE: tl.constexpr,
    TOKENS_ON_M: tl.constexpr, P_RELATIVE: tl.constexpr,
):  # fmt: skip
    """A row block's result: the output and LSE, or a split's fp32 partials and base-2 LSEs
    for the merge kernel (``acc`` is ``[512, rows]`` when the tokens sat on M, and in units of
    ``v_scale``, the largest per-token scale, with ``P_RELATIVE``)."""
    dv = tl.arange(0, DV)
    has = l_i > 0.0
    if P_RELATIVE:
        out_scale = out_scale * v_scale
    inv_l = 1.0 / tl.where(has, l_i, 1.0) * out_scale
    lse2 = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    if NUM_SPLITS == 1:
        o_off = b * stride_ob + t * stride_ot + h * stride_oh
        if TOKENS_ON_M:
            tl.store(out_ptr + o_off[None, :] + dv[:, None],
                     (acc * inv_l[None, :]).to(out_ptr.dtype.element_ty),
                     mask=row_ok[None, :])  # fmt: skip
        else:
            tl.store(out_ptr + o_off[:, None] + dv[None, :],
                     (acc * inv_l[:, None]).to(out_ptr.dtype.element_ty),
                     mask=row_ok[:, None])  # fmt: skip
        if WRITE_LSE:
            row = (b * q_len + t) * num_heads + h
            tl.store(lse_ptr + row, lse2 * 0.6931471805599453, mask=row_ok)
    else:
        row = ((b * q_len + t) * num_heads + h) * NUM_SPLITS + split
        if TOKENS_ON_M:
            tl.store(part_out_ptr + row[None, :] * DV + dv[:, None], acc * inv_l[None, :],
                     mask=row_ok[None, :])  # fmt: skip
        else:
            tl.store(part_out_ptr + row[:, None] * DV + dv[None, :], acc * inv_l[:, None],
                     mask=row_ok[:, None])  # fmt: skip
        tl.store(part_lse_ptr + row, lse2, mask=row_ok)


@triton.jit
def _block_rows(rb, rows_per_group, blocks_per_group, fold, num_heads, BLOCK_H: tl.constexpr):
    """A program's rows: their query token, head, and whether they exist."""
    group = rb // blocks_per_group
    r = (rb % blocks_per_group) * BLOCK_H + tl.arange(0, BLOCK_H)
    return group * fold + r // num_heads, r % num_heads, r < rows_per_group


@triton.jit
def _init_state(BLOCK_H: tl.constexpr, DV: tl.constexpr, TOKENS_ON_M: tl.constexpr):
    """Running max, denominator, output accumulator and the accumulator's scale (the largest
    per-token cache scale seen, when there are any) of an empty online softmax."""
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    if TOKENS_ON_M:
        acc = tl.zeros([DV, BLOCK_H], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_H, DV], dtype=tl.float32)
    return m_i, l_i, acc, tl.zeros([], dtype=tl.float32)


@triton.jit
def _split_range(seq_lens_ptr, b, split, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """A request's length and this split's ``[start, end)`` of it, whole tiles per split."""
    seq_len = tl.load(seq_lens_ptr + b)
    per_split = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    return seq_len, start, tl.minimum(start + per_split, seq_len)


@triton.jit
def _kv_scales(qk_scale, q_f16_scale, kv_scale_ptr, SCALE_MODE: tl.constexpr,
               F16_QUERY: tl.constexpr):  # fmt: skip
    """The scores' scale and the output's: a per-tensor FP8 scale folds into both, and the
    scores undo the query's f16 scaling."""
    scale = qk_scale
    out_scale = 1.0
    if SCALE_MODE == 1:
        out_scale = tl.load(kv_scale_ptr).to(tl.float32)
        scale = qk_scale * out_scale
    if F16_QUERY:
        scale = scale / q_f16_scale
    return scale, out_scale


@triton.jit
def _products_query(q_c, q_r, q_f16_scale, F16_QUERY: tl.constexpr):
    """The query as the products take it: a bf16 query over an FP8 cache in f16, scaled into
    its range."""
    if F16_QUERY:
        q_c = (q_c.to(tl.float32) * q_f16_scale).to(tl.float16)
        q_r = (q_r.to(tl.float32) * q_f16_scale).to(tl.float16)
    return q_c, q_r


@triton.jit
def _gather_tile(
    kv_ptr, block_table_ptr, kv_scale_ptr, b, pos, tok_ok, page_size,
    stride_bt, stride_kp, stride_ks, stride_sp, stride_ss, dv, dr, r_ok,
    DV: tl.constexpr, PADDED: tl.constexpr,
):  # fmt: skip
    """A KV tile by pointer loads through the block table (rows past ``tok_ok`` read as 0):
    its compressed and rope parts, and the addresses of its per-token scales."""
    page = tl.load(block_table_ptr + b * stride_bt + pos // page_size, mask=tok_ok, other=0)
    page = page.to(tl.int64)
    slot_in_page = pos % page_size
    kv_off = page * stride_kp + slot_in_page * stride_ks
    kv_c = tl.load(kv_ptr + kv_off[:, None] + dv[None, :], mask=tok_ok[:, None], other=0.0)
    k_r = tl.load(kv_ptr + kv_off[:, None] + DV + dr[None, :],
                  mask=_rope_mask(tok_ok, r_ok, PADDED), other=0.0)  # fmt: skip
    return kv_c, k_r, kv_scale_ptr + page * stride_sp + slot_in_page * stride_ss


@triton.jit
def _mla_decode_split_kernel(
    q_ptr, kv_ptr, block_table_ptr, seq_lens_ptr, kv_scale_ptr,
    out_ptr, lse_ptr, part_out_ptr, part_lse_ptr,
    qk_scale, q_f16_scale,
    num_heads, q_len, fold, rows_per_group, blocks_per_group, page_size,
    stride_qb, stride_qt, stride_qh,
    stride_kp, stride_ks,
    stride_bt,
    stride_sp, stride_ss,
    stride_ob, stride_ot, stride_oh,
    DV: tl.constexpr, DR: tl.constexpr, BLOCK_R: tl.constexpr,
    NUM_SPLITS: tl.constexpr, SCALE_MODE: tl.constexpr, WRITE_LSE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    Q_RELOAD: tl.constexpr, TOKENS_ON_M: tl.constexpr, F16_QUERY: tl.constexpr,
    P_RELATIVE: tl.constexpr,
):  # fmt: skip
    """One row block of one request over one split, every tile gathered by pointer loads."""
    rb = tl.program_id(0)
    split = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)

    t, h, row_ok = _block_rows(rb, rows_per_group, blocks_per_group, fold, num_heads, BLOCK_H)
    dv = tl.arange(0, DV)
    dr = tl.arange(0, BLOCK_R)  # the rope dims, padded to a dot's minimum K of 16
    r_ok = dr < DR  # all true unless DR < 16

    seq_len, start, end = _split_range(seq_lens_ptr, b, split, NUM_SPLITS, BLOCK_N)
    q_pos = seq_len - q_len + t  # kv position of each row's query token (causal bound)

    q_off = b * stride_qb + t * stride_qt + h * stride_qh
    q_c, q_r = _load_q(q_ptr, q_off, row_ok, dv, dr, r_ok, DV, BLOCK_R != DR, TOKENS_ON_M)
    q_c, q_r = _products_query(q_c, q_r, q_f16_scale, F16_QUERY)
    compute_ty = q_c.dtype
    scale, out_scale = _kv_scales(qk_scale, q_f16_scale, kv_scale_ptr, SCALE_MODE, F16_QUERY)

    m_i, l_i, acc, v_scale = _init_state(BLOCK_H, DV, TOKENS_ON_M)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        tok_ok = pos < end
        kv_c, k_r, scale_ptrs = _gather_tile(
            kv_ptr, block_table_ptr, kv_scale_ptr, b, pos, tok_ok, page_size,
            stride_bt, stride_kp, stride_ks, stride_sp, stride_ss, dv, dr, r_ok, DV, BLOCK_R != DR,
        )  # fmt: skip
        kv_c = kv_c.to(compute_ty)
        k_r = k_r.to(compute_ty)

        if Q_RELOAD:  # re-read q (L1/L2 hits) instead of holding it across the loop
            q_c, q_r = _load_q(q_ptr, q_off, row_ok, dv, dr, r_ok, DV, BLOCK_R != DR,
                               TOKENS_ON_M)  # fmt: skip
            q_c, q_r = _products_query(q_c, q_r, q_f16_scale, F16_QUERY)
        m_i, l_i, acc, v_scale = _attend_tile(q_c, q_r, kv_c, k_r, scale_ptrs, pos, tok_ok, q_pos,
                                              m_i, l_i, acc, v_scale, scale, SCALE_MODE,
                                              DOT_PRECISION, TOKENS_ON_M, P_RELATIVE)  # fmt: skip

    _write_rows(acc, m_i, l_i, out_scale, v_scale, b, t, h, row_ok, split, out_ptr, lse_ptr,
                part_out_ptr, part_lse_ptr, num_heads, q_len, stride_ob, stride_ot, stride_oh, DV,
                NUM_SPLITS, WRITE_LSE, TOKENS_ON_M, P_RELATIVE)  # fmt: skip


@triton.jit
def _mla_decode_split_kernel_tma(
    q_ptr, kv_ptr, kv_c_desc, k_r_desc, block_table_ptr, seq_lens_ptr, kv_scale_ptr,
    out_ptr, lse_ptr, part_out_ptr, part_lse_ptr,
    qk_scale, q_f16_scale,
    num_heads, q_len, fold, rows_per_group, blocks_per_group, page_size,
    stride_qb, stride_qt, stride_qh,
    stride_kp, stride_ks,
    stride_bt,
    stride_sp, stride_ss,
    stride_ob, stride_ot, stride_oh,
    DV: tl.constexpr, DR: tl.constexpr,
    NUM_SPLITS: tl.constexpr, SCALE_MODE: tl.constexpr, WRITE_LSE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    TOKENS_ON_M: tl.constexpr, F16_QUERY: tl.constexpr, P_RELATIVE: tl.constexpr,
):  # fmt: skip
    """The same program with every whole KV tile fetched by TMA (a tile lies in one page, so
    its rows are contiguous): no per-token addresses, nothing staged through registers. The
    tail tile of a split, if partial, is read with masked loads (its rows past the end may
    hold anything, even NaN)."""
    rb = tl.program_id(0)
    split = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)

    t, h, row_ok = _block_rows(rb, rows_per_group, blocks_per_group, fold, num_heads, BLOCK_H)
    dv = tl.arange(0, DV)
    dr = tl.arange(0, DR)
    tn = tl.arange(0, BLOCK_N)

    seq_len, start, end = _split_range(seq_lens_ptr, b, split, NUM_SPLITS, BLOCK_N)
    q_pos = seq_len - q_len + t
    whole_end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N

    q_off = b * stride_qb + t * stride_qt + h * stride_qh
    q_c, q_r = _load_q(q_ptr, q_off, row_ok, dv, dr, dr >= 0, DV, False, TOKENS_ON_M)
    q_c, q_r = _products_query(q_c, q_r, q_f16_scale, F16_QUERY)
    compute_ty = q_c.dtype
    scale, out_scale = _kv_scales(qk_scale, q_f16_scale, kv_scale_ptr, SCALE_MODE, F16_QUERY)

    m_i, l_i, acc, v_scale = _init_state(BLOCK_H, DV, TOKENS_ON_M)
    all_ok = tn >= 0

    for n0 in range(start, whole_end, BLOCK_N):
        page = tl.load(block_table_ptr + b * stride_bt + n0 // page_size).to(tl.int64)
        slot = n0 % page_size
        row = (page * page_size + slot).to(tl.int32)
        kv_c = kv_c_desc.load([row, 0]).to(compute_ty)
        k_r = k_r_desc.load([row, DV]).to(compute_ty)
        scale_ptrs = kv_scale_ptr + page * stride_sp + (slot + tn) * stride_ss
        m_i, l_i, acc, v_scale = _attend_tile(q_c, q_r, kv_c, k_r, scale_ptrs, n0 + tn, all_ok,
                                              q_pos, m_i, l_i, acc, v_scale, scale, SCALE_MODE,
                                              DOT_PRECISION, TOKENS_ON_M, P_RELATIVE)  # fmt: skip

    if whole_end < end:
        pos = whole_end + tn
        tok_ok = pos < end
        kv_c, k_r, scale_ptrs = _gather_tile(
            kv_ptr, block_table_ptr, kv_scale_ptr, b, pos, tok_ok, page_size,
            stride_bt, stride_kp, stride_ks, stride_sp, stride_ss, dv, dr, dr >= 0, DV, False,
        )  # fmt: skip
        m_i, l_i, acc, v_scale = _attend_tile(q_c, q_r, kv_c.to(compute_ty), k_r.to(compute_ty),
                                              scale_ptrs, pos, tok_ok, q_pos, m_i, l_i, acc,
                                              v_scale, scale, SCALE_MODE, DOT_PRECISION,
                                              TOKENS_ON_M, P_RELATIVE)  # fmt: skip

    _write_rows(acc, m_i, l_i, out_scale, v_scale, b, t, h, row_ok, split, out_ptr, lse_ptr,
                part_out_ptr, part_lse_ptr, num_heads, q_len, stride_ob, stride_ot, stride_oh, DV,
                NUM_SPLITS, WRITE_LSE, TOKENS_ON_M, P_RELATIVE)  # fmt: skip


@triton.jit
def _mla_decode_merge_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, lse_ptr,
    num_heads, q_len,
    stride_ob, stride_ot, stride_oh,
    DV: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)  # (b * q_len + t) * H + h
    h = row % num_heads
    t = (row // num_heads) % q_len
    b = row // (num_heads * q_len)
    s = tl.arange(0, BLOCK_S)
    dv = tl.arange(0, DV)
    lses = tl.load(part_lse_ptr + row * NUM_SPLITS + s, mask=s < NUM_SPLITS, other=float("-inf"))
    m = tl.max(lses, axis=0)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    total = tl.sum(tl.exp2(lses - m_use), axis=0)
    acc = tl.zeros([DV], dtype=tl.float32)
    for i in range(NUM_SPLITS):
        w = tl.exp2(tl.load(part_lse_ptr + row * NUM_SPLITS + i) - m_use)
        part = tl.load(part_out_ptr + (row * NUM_SPLITS + i) * DV + dv)
        acc += tl.where(w > 0.0, part * w, 0.0)
    has = total > 0.0
    res = acc / tl.where(has, total, 1.0)
    o_off = b * stride_ob + t * stride_ot + h * stride_oh
    tl.store(out_ptr + o_off + dv, res.to(out_ptr.dtype.element_ty))
    if WRITE_LSE:
        lse2 = tl.where(has, m_use + tl.log2(tl.where(has, total, 1.0)), float("-inf"))
        tl.store(lse_ptr + row, lse2 * 0.6931471805599453)


def _dot_precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def _tma_ok(cache: torch.Tensor, block_n: int, rope: int, tokens_on_m: bool = False) -> bool:
    """Whether whole KV tiles can be fetched by TMA: Hopper or newer, a tile inside one page,
    the pages' rows packed (a 2-D view with 16-byte aligned rows), a power-of-two rope dim.
    Transposed launches take TMA only up to 32-token tiles: at 64, Triton 3.6's program read
    out of bounds on an H100 (wrong rows, then an illegal address; 16 and 32 are correct)."""
    return (
        not (tokens_on_m and block_n > 32)
        and cache.is_cuda
        and tma_capable()
        and cache.shape[1] % block_n == 0
        and cache.stride(1) == cache.shape[2]
        and cache.stride(0) == cache.shape[1] * cache.shape[2]
        and rope >= 16
        and rope & (rope - 1) == 0
    )


def _scale_mode(kv_cache: torch.Tensor, kv_scale: torch.Tensor | None) -> int:
    if kv_scale is None:
        if kv_cache.element_size() == 1:
            raise ValueError("an FP8 latent cache needs kv_scale")
        return SCALE_NONE
    return SCALE_TENSOR if kv_scale.numel() == 1 else SCALE_TOKEN


def mla_decode(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    softmax_scale: float,
    *,
    out: torch.Tensor | None = None,
    return_lse: bool = False,
    kv_scale: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    num_splits: int | None = None,
    fold_sq_factor: int | None = None,
    kv_lora_rank: int = 512,
    max_seq_len: int | None = None,
    config: Mapping[str, Any] | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Triton split-KV MLA decode; see ``tokenspeed.mla.mla_decode`` for the contract."""
    batch, q_len, heads, dim = query.shape
    cache = kv_cache.reshape(kv_cache.shape[0], kv_cache.shape[1], kv_cache.shape[-1])
    page_size = cache.shape[1]
    rope = dim - kv_lora_rank
    if query.stride(-1) != 1 or cache.stride(-1) != 1:
        raise ValueError("mla_decode needs unit stride along the latent dim")
    plan = plan_decode(
        batch, q_len, heads, block_tables.shape[1] * page_size, page_size,
        kv_lora_rank=kv_lora_rank, max_seq_len=max_seq_len, num_splits=num_splits,
        fold_sq_factor=fold_sq_factor, config=config, fp8=cache.element_size() == 1,
    )  # fmt: skip
    if out is None:
        out = torch.empty(batch, q_len, heads, kv_lora_rank, dtype=query.dtype, device=query.device)
    lse = (
        torch.empty(batch, q_len, heads, dtype=torch.float32, device=query.device)
        if return_lse
        else out
    )
    if batch == 0:
        return (out, lse) if return_lse else out
    splits = plan["num_splits"]
    if splits > 1:
        need = plan["workspace_bytes"]
        if workspace is None:
            workspace = torch.empty(need, dtype=torch.uint8, device=query.device)
        elif workspace.numel() * workspace.element_size() < need:
            raise ValueError(
                f"mla_decode workspace holds {workspace.numel() * workspace.element_size()} "
                f"bytes, needs {need} (see mla_decode_plan)"
            )
        floats = workspace.view(torch.uint8)[:need].view(torch.float32)
        rows = batch * q_len * heads * splits
        part_out, part_lse = floats[: rows * kv_lora_rank], floats[rows * kv_lora_rank :]
    else:
        part_out = part_lse = out  # unused
    scale_mode = _scale_mode(cache, kv_scale)
    if scale_mode == SCALE_TOKEN:
        scale_t = kv_scale.reshape(cache.shape[0], page_size)
        stride_sp, stride_ss = scale_t.stride(0), scale_t.stride(1)
    else:
        scale_t = kv_scale if kv_scale is not None else out
        stride_sp = stride_ss = 0
    # f16 products over an FP8 cache for a 16-bit query; a bf16 one is converted in the kernel
    # up to 32-row blocks (at 64 rows the converted query is held in registers as the MMA's A
    # operand and the launch spills, 1.2-1.8x slower on an H200: bf16 products stay there)
    f16_query = scale_mode != SCALE_NONE and query.dtype == torch.bfloat16 and plan["block_h"] <= 32
    f16_products = scale_mode != SCALE_NONE and (query.dtype == torch.float16 or f16_query)
    grid = (plan["row_blocks"], splits, batch)
    common = (
        block_tables, seq_lens, scale_t,
        out, lse, part_out, part_lse,
        softmax_scale * _LOG2E, Q_F16_SCALE,
        heads, q_len, plan["fold"], plan["rows_per_group"], plan["blocks_per_group"], page_size,
        query.stride(0), query.stride(1), query.stride(2),
        cache.stride(0), cache.stride(1),
        block_tables.stride(0),
        stride_sp, stride_ss,
        out.stride(0), out.stride(1), out.stride(2),
    )  # fmt: skip
    meta = dict(
        DV=kv_lora_rank, DR=rope, NUM_SPLITS=splits, SCALE_MODE=scale_mode, WRITE_LSE=return_lse,
        DOT_PRECISION=_dot_precision(query.dtype), BLOCK_H=plan["block_h"],
        BLOCK_N=plan["block_n"], TOKENS_ON_M=plan["tokens_on_m"],
        F16_QUERY=f16_query, P_RELATIVE=scale_mode == SCALE_TOKEN and f16_products,
        num_warps=plan["num_warps"], num_stages=plan["num_stages"],
    )  # fmt: skip
    if plan["tma"] and _tma_ok(cache, plan["block_n"], rope, bool(plan["tokens_on_m"])):
        from triton.tools.tensor_descriptor import TensorDescriptor

        rows = cache.view(cache.shape[0] * page_size, dim)  # a tile's tokens are adjacent rows
        kv_c_desc = TensorDescriptor.from_tensor(rows, [plan["block_n"], kv_lora_rank])
        k_r_desc = TensorDescriptor.from_tensor(rows, [plan["block_n"], rope])
        _mla_decode_split_kernel_tma[grid](query, cache, kv_c_desc, k_r_desc, *common, **meta)
    else:
        _mla_decode_split_kernel[grid](
            query, cache, *common, BLOCK_R=max(16, triton.next_power_of_2(rope)),
            Q_RELOAD=plan["q_reload"], **meta,
        )  # fmt: skip
    if splits > 1:
        _mla_decode_merge_kernel[(batch * q_len * heads,)](
            part_out, part_lse, out, lse,
            heads, q_len,
            out.stride(0), out.stride(1), out.stride(2),
            DV=kv_lora_rank, NUM_SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits),
            WRITE_LSE=return_lse, num_warps=4,
        )  # fmt: skip
    return (out, lse) if return_lse else out
