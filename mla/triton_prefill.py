"""Ragged varlen MLA prefill attention (q/k head dim 192, v 128), in Triton.

FlashAttention-2 style: a program owns ``BLOCK_M`` query rows of one head of one request,
streams that request's keys/values ``BLOCK_N`` at a time with ``tl.dot`` (fp32 accumulation)
and an online softmax in the exp2 domain. The 192-dim q/k rows are two power-of-two parts
(128 + 64), each its own ``tl.dot`` into the same scores.

Causal attention aligns the query block to the end of the KV sequence (query ``i`` of a
request with ``q_len`` queries and ``kv_len`` keys sees keys ``j <= i + kv_len - q_len``).
The key loop runs in two phases: tiles every row of the block fully sees (no mask at all),
then the diagonal/tail tiles (masked); tiles above the diagonal are never visited. Query
blocks are launched longest-first (reversed ``program_id``), which balances causal work.

Grid: (head x request, query block); without ``max_seqlen_q`` the query-block count is
bounded by the total query tokens (no host read), and surplus programs do no work.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .configs import prefill_default_config

_LOG2E = 1.4426950408889634


@triton.jit
def _mla_prefill_kernel(
    q_ptr, k_ptr, v_ptr, cu_q_ptr, cu_k_ptr, out_ptr, lse_ptr,
    qk_scale,
    num_heads, group,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_lt,
    DA: tl.constexpr, DB: tl.constexpr, HAS_B: tl.constexpr, DV: tl.constexpr,
    CAUSAL: tl.constexpr, WRITE_LSE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    hb = tl.program_id(0)
    h = hb % num_heads
    b = hb // num_heads
    kv_h = h // group

    q_start = tl.load(cu_q_ptr + b)
    q_len = tl.load(cu_q_ptr + b + 1) - q_start
    k_start = tl.load(cu_k_ptr + b)
    kv_len = tl.load(cu_k_ptr + b + 1) - k_start
    # Longest (last) query blocks first: reversed block index; negative -> no work.
    m_block = tl.cdiv(q_len, BLOCK_M) - 1 - tl.program_id(1)
    m_start = m_block * BLOCK_M
    rows = m_start + tl.arange(0, BLOCK_M)
    row_ok = (rows >= 0) & (rows < q_len)
    offset = kv_len - q_len  # end alignment of the causal diagonal

    da = tl.arange(0, DA)
    db = tl.arange(0, DB)
    dv = tl.arange(0, DV)
    n_idx = tl.arange(0, BLOCK_N)
    q_base = q_ptr + (q_start + rows).to(tl.int64)[:, None] * stride_qt + h * stride_qh
    q_a = tl.load(q_base + da[None, :], mask=row_ok[:, None], other=0.0)
    if HAS_B:
        q_b = tl.load(q_base + DA + db[None, :], mask=row_ok[:, None], other=0.0)
    k_base = k_ptr + k_start.to(tl.int64) * stride_kt + kv_h * stride_kh
    v_base = v_ptr + k_start.to(tl.int64) * stride_vt + kv_h * stride_vh

    if CAUSAL:
        hi = tl.minimum(kv_len, m_start + BLOCK_M + offset)
        full_end = tl.minimum(
            (m_start + offset + 1) // BLOCK_N * BLOCK_N, kv_len // BLOCK_N * BLOCK_N
        )
    else:
        hi = kv_len
        full_end = kv_len // BLOCK_N * BLOCK_N
    full_end = tl.maximum(full_end, 0)
    hi = tl.where(m_block >= 0, hi, 0)
    full_end = tl.minimum(full_end, hi)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DV], dtype=tl.float32)

    # Phase 1: tiles every row of the block sees entirely (no masks).
    for n0 in range(0, full_end, BLOCK_N):
        n = n0 + n_idx
        k_rows = k_base + n.to(tl.int64)[:, None] * stride_kt
        k_a = tl.load(k_rows + da[None, :])
        s = tl.dot(q_a, tl.trans(k_a), input_precision=DOT_PRECISION)
        if HAS_B:
            k_b = tl.load(k_rows + DA + db[None, :])
            s = tl.dot(q_b, tl.trans(k_b), acc=s, input_precision=DOT_PRECISION)
        s = s * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + n.to(tl.int64)[:, None] * stride_vt + dv[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    # Phase 2: the diagonal and the ragged tail (masked).
    for n0 in range(full_end, hi, BLOCK_N):
        n = n0 + n_idx
        n_ok = n < kv_len
        k_rows = k_base + n.to(tl.int64)[:, None] * stride_kt
        k_a = tl.load(k_rows + da[None, :], mask=n_ok[:, None], other=0.0)
        s = tl.dot(q_a, tl.trans(k_a), input_precision=DOT_PRECISION)
        if HAS_B:
            k_b = tl.load(k_rows + DA + db[None, :], mask=n_ok[:, None], other=0.0)
            s = tl.dot(q_b, tl.trans(k_b), acc=s, input_precision=DOT_PRECISION)
        s = s * qk_scale
        visible = n_ok[None, :]
        if CAUSAL:
            visible = visible & (n[None, :] <= rows[:, None] + offset)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + n.to(tl.int64)[:, None] * stride_vt + dv[None, :],
                    mask=n_ok[:, None], other=0.0)  # fmt: skip
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    has = l_i > 0.0
    res = acc / tl.where(has, l_i, 1.0)[:, None]
    o_rows = (q_start + rows).to(tl.int64)
    tl.store(out_ptr + o_rows[:, None] * stride_ot + h * stride_oh + dv[None, :],
             res.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])  # fmt: skip
    if WRITE_LSE:
        lse = tl.where(has, (m_i + tl.log2(tl.where(has, l_i, 1.0))) * 0.6931471805599453,
                       float("-inf"))  # fmt: skip
        tl.store(lse_ptr + o_rows * stride_lt + h, lse, mask=row_ok)


def _split_dim(dim: int) -> tuple[int, int, bool]:
    """A head dim as a power-of-two part plus a power-of-two remainder (192 = 128 + 64)."""
    a = 1 << (dim.bit_length() - 1)
    rest = dim - a
    if rest and rest & (rest - 1):
        raise ValueError(f"head dim {dim} is not a sum of two powers of two")
    return a, (rest or 16), bool(rest)


def mla_prefill(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_kv: torch.Tensor,
    *,
    softmax_scale: float,
    causal: bool = True,
    return_lse: bool = False,
    max_seqlen_q: int | None = None,
    max_seqlen_kv: int | None = None,
    out: torch.Tensor | None = None,
    config: Mapping[str, Any] | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Triton varlen prefill; see ``tokenspeed.mla.mla_prefill`` for the contract."""
    del max_seqlen_kv
    tq, heads, dim = query.shape
    heads_kv = key.shape[1]
    dv = value.shape[-1]
    if query.stride(-1) != 1 or key.stride(-1) != 1 or value.stride(-1) != 1:
        raise ValueError("mla_prefill needs unit stride along the head dim")
    cfg = dict(prefill_default_config({"num_tokens": tq, "qk_head_dim": dim}))
    cfg.update(config or {})
    da, db, has_b = _split_dim(dim)
    if out is None:
        out = torch.empty(tq, heads, dv, dtype=query.dtype, device=query.device)
    lse = torch.empty(tq, heads, dtype=torch.float32, device=query.device) if return_lse else out
    batch = cu_seqlens_q.numel() - 1
    if tq == 0 or batch <= 0:
        return (out, lse) if return_lse else out
    block_m = int(cfg["block_m"])
    bound = min(max_seqlen_q, tq) if max_seqlen_q else tq
    grid = (heads * batch, triton.cdiv(bound, block_m))
    _mla_prefill_kernel[grid](
        query, key, value, cu_seqlens_q, cu_seqlens_kv, out, lse,
        softmax_scale * _LOG2E,
        heads, heads // heads_kv,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1),
        value.stride(0), value.stride(1), out.stride(0), out.stride(1),
        lse.stride(0) if return_lse else 0,
        DA=da, DB=db, HAS_B=has_b, DV=dv,
        CAUSAL=bool(causal), WRITE_LSE=bool(return_lse),
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        BLOCK_M=block_m, BLOCK_N=int(cfg["block_n"]),
        num_warps=int(cfg["num_warps"]), num_stages=int(cfg["num_stages"]),
    )  # fmt: skip
    return (out, lse) if return_lse else out
