"""Ragged varlen MLA prefill attention (q/k head dim 192, v head dim 128), in Triton.

FlashAttention-2 style: a program owns ``BLOCK_M`` query rows of one head of one request,
streams that request's keys/values ``BLOCK_N`` at a time with ``tl.dot`` (fp32 accumulation)
and an online softmax in the exp2 domain (the softmax scale folded into one FMA per score).
The 192-dim q/k rows are two power-of-two parts (128 + 64), each its own ``tl.dot`` into the
same scores (Triton tiles must be powers of two).

Causal attention aligns the query block to the end of the KV sequence (query ``i`` of a
request with ``q_len`` queries and ``kv_len`` keys sees keys ``j <= i + kv_len - q_len``).
The key loop runs in two phases: tiles every row of the block fully sees (no mask at all),
then the diagonal/tail tiles (masked); tiles above the diagonal are never visited.

Launch (config keys; ``docs/mla.md`` has the H200 numbers): the grid is 1-D with the query
blocks of one (head, request) next to each other, longest first, so the ~132 programs
resident at a time share one head's K/V stream through L2. ``tma`` = 1 (the default for
128-row tiles) loads the unmasked K/V tiles with Hopper TMA (host tensor descriptors)
instead of ``cp.async``: no per-thread address math and no register staging. Masked tiles
keep pointer loads (their rows may cross the request's end; TMA would read the next
request's rows, so exactness would depend on those values being finite). Issuing the next
tile's scores before the softmax, or FlashAttention-3's ``QK(j), PV(j - 1), softmax(j)``
order, measured slower on the H200 with Triton 3.6 (0.60-0.74x cuDNN against 0.77-0.82x)
and were removed; so was the head-major grid order (0.49x).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .configs import prefill_default_config

_LOG2E = 1.4426950408889634
_LN2: tl.constexpr = tl.constexpr(0.6931471805599453)  # ln 2, a constexpr so @jit can read it


@triton.jit
def _scores(q_a, q_b, k_a, k_b, HAS_B: tl.constexpr, PREC: tl.constexpr):
    """Unscaled ``q @ k^T`` over both parts of the q/k head dim."""
    if HAS_B:  # the 64-wide part first: Triton waits for it before chaining the 128-wide one
        s = tl.dot(q_b, tl.trans(k_b), input_precision=PREC)
        s = tl.dot(q_a, tl.trans(k_a), acc=s, input_precision=PREC)
    else:
        s = tl.dot(q_a, tl.trans(k_a), input_precision=PREC)
    return s


@triton.jit
def _rows(base, n, stride, cols, n_lim, MASKED: tl.constexpr, COL_LIM: tl.constexpr = 0):
    """Rows ``n`` of a ``[rows, stride]`` matrix at ``base`` (rows >= ``n_lim`` read as 0).

    ``COL_LIM`` > 0 also reads columns >= ``COL_LIM`` as 0 (a part padded to a dot's K = 16).
    """
    ptrs = base + n.to(tl.int64)[:, None] * stride + cols[None, :]
    if COL_LIM > 0:
        col_ok = (cols < COL_LIM)[None, :]
        if MASKED:
            return tl.load(ptrs, mask=(n < n_lim)[:, None] & col_ok, other=0.0)
        return tl.load(ptrs, mask=col_ok, other=0.0)
    if MASKED:
        return tl.load(ptrs, mask=(n < n_lim)[:, None], other=0.0)
    return tl.load(ptrs)


@triton.jit
def _k_tile(
    k_base, k_desc_a, k_desc_b, n0, row0, col0, n_lim, stride_kt,
    DA: tl.constexpr, DB: tl.constexpr, HAS_B: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, TMA: tl.constexpr, DB_LIM: tl.constexpr,
):  # fmt: skip
    """K rows ``n0 .. n0 + BLOCK_N`` of the request as (first part, second part)."""
    if TMA:
        k_a = k_desc_a.load([row0 + n0, col0])
        k_b = k_a
        if HAS_B:
            k_b = k_desc_b.load([row0 + n0, col0 + DA])
    else:
        n = n0 + tl.arange(0, BLOCK_N)
        k_a = _rows(k_base, n, stride_kt, tl.arange(0, DA), n_lim, MASKED)
        k_b = k_a
        if HAS_B:
            k_b = _rows(k_base + DA, n, stride_kt, tl.arange(0, DB), n_lim, MASKED, DB_LIM)
    return k_a, k_b


@triton.jit
def _v_tile(
    v_base, v_desc, n0, row0, col0, n_lim, stride_vt,
    DV: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """V rows ``n0 .. n0 + BLOCK_N`` of the request."""
    if TMA:
        v = v_desc.load([row0 + n0, col0])
    else:
        v = _rows(v_base, n0 + tl.arange(0, BLOCK_N), stride_vt, tl.arange(0, DV), n_lim, MASKED)
    return v


@triton.jit
def _softmax_step(s, m_i, l_i, qk_scale, visible, MASKED: tl.constexpr):
    """Online-softmax update for one score tile: ``(p, alpha, m_new, l_new)``.

    ``m`` lives in the scaled base-2 domain (``max(s) * qk_scale``, valid for a positive
    scale), so each score costs one FMA and one exp2. Masked tiles may leave a row with
    nothing visible yet: its max stays ``-inf`` and is replaced by 0 so exp2 gives 0, not NaN.
    """
    if MASKED:
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
    m_use = m_new
    if MASKED:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s * qk_scale - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_new = l_i * alpha + tl.sum(p, axis=1)
    return p, alpha, m_new, l_new


@triton.jit
def _mla_prefill_kernel(
    q_ptr, k_ptr, v_ptr, cu_q_ptr, cu_k_ptr, out_ptr, lse_ptr,
    k_desc_a, k_desc_b, v_desc,
    qk_scale,
    num_heads, group, m_blocks,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_lt,
    DA: tl.constexpr, DB: tl.constexpr, HAS_B: tl.constexpr, DB_LIM: tl.constexpr,
    DV: tl.constexpr, CAUSAL: tl.constexpr, WRITE_LSE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    TMA: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    rev = pid % m_blocks  # query blocks of one head adjacent: resident programs share K/V
    hb = pid // m_blocks
    h = hb % num_heads
    b = hb // num_heads
    kv_h = h // group

    q_start = tl.load(cu_q_ptr + b)
    q_len = tl.load(cu_q_ptr + b + 1) - q_start
    k_start = tl.load(cu_k_ptr + b)
    kv_len = tl.load(cu_k_ptr + b + 1) - k_start
    # Longest (last) query blocks first: reversed block index; negative -> no work.
    m_block = tl.cdiv(q_len, BLOCK_M) - 1 - rev
    m_start = m_block * BLOCK_M
    rows = m_start + tl.arange(0, BLOCK_M)
    row_ok = (rows >= 0) & (rows < q_len)
    offset = kv_len - q_len  # end alignment of the causal diagonal

    q_base = q_ptr + (q_start + rows).to(tl.int64)[:, None] * stride_qt + h * stride_qh
    q_a = tl.load(q_base + tl.arange(0, DA)[None, :], mask=row_ok[:, None], other=0.0)
    q_b = q_a
    if HAS_B:
        cols_b = tl.arange(0, DB)
        q_mask = row_ok[:, None]
        if DB_LIM > 0:  # a remainder padded to 16 columns: the pad reads as 0
            q_mask = q_mask & (cols_b < DB_LIM)[None, :]
        q_b = tl.load(q_base + DA + cols_b[None, :], mask=q_mask, other=0.0)
    k_base = k_ptr + k_start.to(tl.int64) * stride_kt + kv_h * stride_kh
    v_base = v_ptr + k_start.to(tl.int64) * stride_vt + kv_h * stride_vh
    k_col = kv_h * stride_kh  # TMA coordinates: [token row, column of this head]
    v_col = kv_h * stride_vh

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
        k_a, k_b = _k_tile(k_base, k_desc_a, k_desc_b, n0, k_start, k_col, kv_len,
                           stride_kt, DA, DB, HAS_B, BLOCK_N, False, TMA, DB_LIM)  # fmt: skip
        s = _scores(q_a, q_b, k_a, k_b, HAS_B, DOT_PRECISION)
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, True, False)
        v = _v_tile(v_base, v_desc, n0, k_start, v_col, kv_len, stride_vt,
                    DV, BLOCK_N, False, TMA)  # fmt: skip
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)

    # Phase 2: the diagonal and the ragged tail (masked, pointer loads).
    for n0 in range(full_end, hi, BLOCK_N):
        k_a, k_b = _k_tile(k_base, k_desc_a, k_desc_b, n0, k_start, k_col, kv_len,
                           stride_kt, DA, DB, HAS_B, BLOCK_N, True, False, DB_LIM)  # fmt: skip
        s = _scores(q_a, q_b, k_a, k_b, HAS_B, DOT_PRECISION)
        n = n0 + tl.arange(0, BLOCK_N)
        visible = (n < kv_len)[None, :]
        if CAUSAL:
            visible = visible & (n[None, :] <= rows[:, None] + offset)
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, visible, True)
        v = _v_tile(v_base, v_desc, n0, k_start, v_col, kv_len, stride_vt,
                    DV, BLOCK_N, True, False)  # fmt: skip
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)

    has = l_i > 0.0
    res = acc / tl.where(has, l_i, 1.0)[:, None]
    o_rows = (q_start + rows).to(tl.int64)
    tl.store(out_ptr + o_rows[:, None] * stride_ot + h * stride_oh + tl.arange(0, DV)[None, :],
             res.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])  # fmt: skip
    if WRITE_LSE:
        lse = tl.where(has, (m_i + tl.log2(tl.where(has, l_i, 1.0))) * _LN2, float("-inf"))
        tl.store(lse_ptr + o_rows * stride_lt + h, lse, mask=row_ok)


def _split_dim(dim: int) -> tuple[int, int, bool, int]:
    """A head dim as a power-of-two part plus a power-of-two remainder (192 = 128 + 64).

    Returns ``(first, second, has_second, second_limit)``: a remainder under 16 (a tiny
    model's 16 + 8) is padded to 16 columns, the minimum K of a dot, and ``second_limit``
    is its real width (0 when no padding is needed).
    """
    a = 1 << (dim.bit_length() - 1)
    rest = dim - a
    if rest and rest & (rest - 1):
        raise ValueError(f"head dim {dim} is not a sum of two powers of two")
    if not rest:
        return a, 16, False, 0
    return a, max(rest, 16), True, rest if rest < 16 else 0


def _tma_ok(*tensors: torch.Tensor) -> bool:
    """Hopper TMA needs a CUDA sm_90+ device, 16-byte aligned bases and token/head strides."""
    if not all(t.is_cuda for t in tensors):
        return False
    if torch.cuda.get_device_capability(tensors[0].device)[0] < 9:
        return False
    for t in tensors:
        size = t.element_size()
        if t.data_ptr() % 16 or (t.stride(0) * size) % 16 or (t.stride(1) * size) % 16:
            return False
    return True


def _descriptor(t: torch.Tensor, block_rows: int, block_cols: int) -> Any:
    """A 2-D TMA descriptor over ``t[T, H, D]`` as ``[T, (H - 1) * stride_h + D]`` rows.

    Head ``h``'s columns start at ``h * stride_h``; the view works for any head stride (a
    K/V split out of one projection), only the last dim must be contiguous.
    """
    from triton.tools.tensor_descriptor import TensorDescriptor

    width = (t.shape[1] - 1) * t.stride(1) + t.shape[2]
    return TensorDescriptor(t, [t.shape[0], width], [t.stride(0), 1], [block_rows, block_cols])


def _descriptors(
    key: torch.Tensor, value: torch.Tensor, da: int, db: int, block_n: int
) -> tuple[Any, Any, Any]:
    """TMA descriptors for the two K parts and V (None, None, None when TMA is unusable)."""
    if not _tma_ok(key, value):
        return None, None, None
    return (
        _descriptor(key, block_n, da),
        _descriptor(key, block_n, db),
        _descriptor(value, block_n, value.shape[-1]),
    )


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
    """Triton varlen prefill; see ``tokenspeed.mla.mla_prefill`` for the contract.

    ``config`` overrides the launch (``block_m``, ``block_n``, ``num_warps``, ``num_stages``,
    ``tma``; see the module docstring). ``softmax_scale`` must be
    non-negative: the running max is kept in the scaled domain.
    """
    del max_seqlen_kv
    tq, heads, dim = query.shape
    heads_kv = key.shape[1]
    dv = value.shape[-1]
    if query.stride(-1) != 1 or key.stride(-1) != 1 or value.stride(-1) != 1:
        raise ValueError("mla_prefill needs unit stride along the head dim")
    if softmax_scale < 0:
        raise ValueError("mla_prefill needs a non-negative softmax_scale")
    cfg = dict(prefill_default_config({"num_tokens": tq, "qk_head_dim": dim}))
    cfg.update(config or {})
    da, db, has_b, db_lim = _split_dim(dim)
    if out is None:
        out = torch.empty(tq, heads, dv, dtype=query.dtype, device=query.device)
    lse = torch.empty(tq, heads, dtype=torch.float32, device=query.device) if return_lse else out
    batch = cu_seqlens_q.numel() - 1
    if tq == 0 or batch <= 0:
        return (out, lse) if return_lse else out
    block_m, block_n = int(cfg["block_m"]), int(cfg["block_n"])
    descs = (None, None, None)
    if int(cfg.get("tma", 0)) and key.shape[0] > 0 and not db_lim:
        descs = _descriptors(key, value, da, db, block_n)
    bound = min(max_seqlen_q, tq) if max_seqlen_q else tq
    m_blocks = triton.cdiv(bound, block_m)
    _mla_prefill_kernel[(heads * batch * m_blocks,)](
        query, key, value, cu_seqlens_q, cu_seqlens_kv, out, lse,
        *descs,
        softmax_scale * _LOG2E,
        heads, heads // heads_kv, m_blocks,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1),
        value.stride(0), value.stride(1), out.stride(0), out.stride(1),
        lse.stride(0) if return_lse else 0,
        DA=da, DB=db, HAS_B=has_b, DB_LIM=db_lim, DV=dv,
        CAUSAL=bool(causal), WRITE_LSE=bool(return_lse),
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        BLOCK_M=block_m, BLOCK_N=block_n,
        TMA=descs[0] is not None,
        num_warps=int(cfg["num_warps"]), num_stages=int(cfg["num_stages"]),
    )  # fmt: skip
    return (out, lse) if return_lse else out
