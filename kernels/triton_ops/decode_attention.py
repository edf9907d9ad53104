"""Paged GQA decode attention with split-KV, in Triton.

Grid: (request, KV head, split). A program loads the query heads of one KV group as a
``[BLOCK_H, D]`` tile (BLOCK_H >= 16 so ``tl.dot`` runs on tensor cores), streams its
split's share of the request's K/V once (``BLOCK_N`` tokens per step, gathered through
the block table, any page size), and keeps an online softmax. When the page size is a
multiple of ``BLOCK_N`` (page-block fast path) a tile never straddles a page: one block-table
lookup per tile and a contiguous ``[BLOCK_N, D]`` load, instead of a page id per token.
Whole tiles run without bounds masks; only a split's last, ragged tile is masked. With one
split it writes the output directly; with several it writes per-split partial outputs and
log-sum-exps that are combined afterwards. Split boundaries come from each request's own
length, so short requests do not leave splits idle; the split count itself comes from
shapes only (``configs.decode_default_config``: one wave of resident programs).

Launch-config switches (all optional; absent means plain pointer loads and a merge launch):

- ``tma``: load page-block tiles with Hopper TMA (a host tensor descriptor over the 4-D
  cache, one ``[1, BLOCK_N, 1, D]`` box per tile): no per-thread address math or cp.async
  issue. Needs ``page_size % block_n == 0``. Where the GPU has no TMA (before sm_90, ROCm) or
  the cache is not 16-byte aligned, the same tiles are loaded through pointers instead. The
  descriptor holds only the cache's base address, shape and strides (the page ids come from
  the block table inside the kernel), so a captured CUDA graph stays valid for new block
  tables and lengths as long as the KV pool is not reallocated.
- ``carry_pages``: fetch the next tile's page ids one iteration ahead (see
  ``paged_tiles.tile_pages``), which lets the pipeliner double-buffer K/V at 3 stages.
- ``merge``: ``"kernel"`` (default) combines the splits in a second launch; ``"fused"`` lets
  the last split of each (request, KV head) to finish do it (a per-group arrival counter,
  reset by that program, so no memset and no second launch). The order of the combination is
  fixed, so results do not depend on which split arrives last.
- ``maxnreg``: cap registers per thread (more resident programs per SM).
- ``pdl``: programmatic dependent launch of the split kernel (``pdl.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .arrival import last_arrival, zeroed_buffer
from .common import dot_precision
from .configs import decode_default_config
from .paged_tiles import kv_tile_rows, paged_kv_tile, tile_pages
from .pdl import pdl_constexprs, pdl_launch_options, pdl_mode, pdl_prologue

_LOG2E = 1.4426950408889634


# -- tile loads and the online-softmax step --------------------------------------------------


@triton.jit
def _kv_tile_pointers(
    pages, n0, end, b, kv_head, block_table_ptr, k_cache_ptr, v_cache_ptr,
    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt,
    MASKED: tl.constexpr, CARRY_PAGES: tl.constexpr,
    head_dim: tl.constexpr, v_head_dim: tl.constexpr,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):  # fmt: skip
    """K and V of tokens ``[n0, n0 + BLOCK_N)`` by pointer gathers (any page size).

    With ``CARRY_PAGES`` the page ids come from the previous iteration (``pages``);
    otherwise they are looked up here.
    """
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    if CARRY_PAGES:
        tok_ok = ((n0 + tl.arange(0, BLOCK_N)) < end) | (not MASKED)
        k_rows, v_rows = kv_tile_rows(
            pages, n0, kv_head, k_cache_ptr, v_cache_ptr,
            stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, PAGE_SIZE, BLOCK_N,
        )  # fmt: skip
    else:
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
    v = tl.load(
        v_rows[:, None] + dv[None, :],
        mask=tok_ok[:, None] & (dv[None, :] < v_head_dim),
        other=0.0,
    )
    return k, v, tok_ok


@triton.jit
def _kv_tile_tma(
    k_desc, v_desc, pages, n0, end, b, kv_head, block_table_ptr, stride_bt,
    MASKED: tl.constexpr, CARRY_PAGES: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    """K and V of tokens ``[n0, n0 + BLOCK_N)`` as two TMA boxes (the tile is inside a page).

    The box may run past the request's last token but never past its page; those rows of
    V are zeroed so that garbage (even NaN) cannot reach the output through a zero weight.
    """
    tok_ok = ((n0 + tl.arange(0, BLOCK_N)) < end) | (not MASKED)
    if CARRY_PAGES:
        page = pages
    else:
        page = tl.load(block_table_ptr + b * stride_bt + n0 // PAGE_SIZE)
    offset = n0 % PAGE_SIZE
    k = k_desc.load([page, offset, kv_head, 0]).reshape([BLOCK_N, BLOCK_D])
    v = v_desc.load([page, offset, kv_head, 0]).reshape([BLOCK_N, BLOCK_DV])
    if MASKED:
        v = tl.where(tok_ok[:, None], v, 0.0)
    return k, v, tok_ok


@triton.jit
def _decode_tile(
    acc, m_i, l_i, q, pages, n0, end, b, kv_head,
    k_cache_ptr, v_cache_ptr, block_table_ptr, k_desc, v_desc,
    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt,
    qk_scale,
    MASKED: tl.constexpr, USE_TMA: tl.constexpr, CARRY_PAGES: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    head_dim: tl.constexpr, v_head_dim: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    """One ``BLOCK_N``-token step of the online softmax over tokens ``[n0, n0 + BLOCK_N)``."""
    if USE_TMA:
        k, v, tok_ok = _kv_tile_tma(
            k_desc, v_desc, pages, n0, end, b, kv_head, block_table_ptr, stride_bt,
            MASKED, CARRY_PAGES, PAGE_SIZE, BLOCK_N, BLOCK_D, BLOCK_DV,
        )  # fmt: skip
    else:
        k, v, tok_ok = _kv_tile_pointers(
            pages, n0, end, b, kv_head, block_table_ptr, k_cache_ptr, v_cache_ptr,
            stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt,
            MASKED, CARRY_PAGES, head_dim, v_head_dim, PAGE_SIZE, BLOCK_N, BLOCK_D, BLOCK_DV,
        )  # fmt: skip
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # log2 domain
    if MASKED:
        scores = tl.where(tok_ok[None, :], scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(scores - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _attend_range(
    acc, m_i, l_i, q, start, full_end, end, b, kv_head,
    k_cache_ptr, v_cache_ptr, block_table_ptr, k_desc, v_desc,
    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt,
    qk_scale,
    USE_TMA: tl.constexpr, CARRY_PAGES: tl.constexpr, DOT_PRECISION: tl.constexpr,
    head_dim: tl.constexpr, v_head_dim: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    """Tokens ``[start, end)``: whole tiles up to ``full_end`` unmasked, then the ragged rest.

    With ``CARRY_PAGES`` each iteration fetches the next tile's page ids and hands them on.
    """
    pages = tile_pages(start, end, b, block_table_ptr, stride_bt, PAGE_SIZE, BLOCK_N)
    for n0 in range(start, full_end, BLOCK_N):
        next_pages = pages
        if CARRY_PAGES:
            next_pages = tile_pages(n0 + BLOCK_N, end, b, block_table_ptr, stride_bt,
                                    PAGE_SIZE, BLOCK_N)  # fmt: skip
        acc, m_i, l_i = _decode_tile(
            acc, m_i, l_i, q, pages, n0, end, b, kv_head,
            k_cache_ptr, v_cache_ptr, block_table_ptr, k_desc, v_desc,
            stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt,
            qk_scale, False, USE_TMA, CARRY_PAGES, DOT_PRECISION, head_dim, v_head_dim,
            PAGE_SIZE, BLOCK_N, BLOCK_D, BLOCK_DV,
        )  # fmt: skip
        pages = next_pages
    for n0 in range(full_end, end, BLOCK_N):
        acc, m_i, l_i = _decode_tile(
            acc, m_i, l_i, q, pages, n0, end, b, kv_head,
            k_cache_ptr, v_cache_ptr, block_table_ptr, k_desc, v_desc,
            stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt,
            qk_scale, True, USE_TMA, CARRY_PAGES, DOT_PRECISION, head_dim, v_head_dim,
            PAGE_SIZE, BLOCK_N, BLOCK_D, BLOCK_DV,
        )  # fmt: skip
    return acc, m_i, l_i


# -- writing results: direct, partial, merged ------------------------------------------------


@triton.jit
def _store_out(out_ptr, b, heads, head_ok, stride_ob, stride_oh, out,
               v_head_dim: tl.constexpr, BLOCK_DV: tl.constexpr):  # fmt: skip
    dv = tl.arange(0, BLOCK_DV)
    tl.store(
        out_ptr + b * stride_ob + heads[:, None] * stride_oh + dv[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=head_ok[:, None] & (dv[None, :] < v_head_dim),
    )


@triton.jit
def _store_partial(part_out_ptr, part_lse_ptr, row, heads, head_ok, acc, m_i, l_i,
                   stride_pr, stride_ph, stride_lr, stride_lh,
                   v_head_dim: tl.constexpr, BLOCK_DV: tl.constexpr):  # fmt: skip
    """Normalised partial output and its log2-sum-exp (``-inf`` for an empty part)."""
    dv = tl.arange(0, BLOCK_DV)
    has_tokens = l_i > 0
    tl.store(
        part_out_ptr + row * stride_pr + heads[:, None] * stride_ph + dv[None, :],
        acc / tl.where(has_tokens, l_i, 1.0)[:, None],
        mask=head_ok[:, None] & (dv[None, :] < v_head_dim),
    )
    lse = tl.where(has_tokens, m_i + tl.log2(tl.where(has_tokens, l_i, 1.0)), float("-inf"))
    tl.store(part_lse_ptr + row * stride_lr + heads * stride_lh, lse, mask=head_ok)


@triton.jit
def _merge_step(acc, m_i, l_i, part_out_ptr, part_lse_ptr, row, heads, head_ok,
                stride_pr, stride_ph, stride_lr, stride_lh, BLOCK_DV: tl.constexpr):  # fmt: skip
    """Fold one partial (row ``row`` of the partial buffers) into a running merge.

    Loads bypass L1 (``.cg``): the partial was written by another program of this launch.
    """
    dv = tl.arange(0, BLOCK_DV)
    lse = tl.load(part_lse_ptr + row * stride_lr + heads * stride_lh, mask=head_ok,
                  other=float("-inf"), cache_modifier=".cg")  # fmt: skip
    part = tl.load(
        part_out_ptr + row * stride_pr + heads[:, None] * stride_ph + dv[None, :],
        mask=head_ok[:, None], other=0.0, cache_modifier=".cg",
    )  # fmt: skip
    m_new = tl.maximum(m_i, lse)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    w = tl.exp2(lse - m_safe)
    return acc * alpha[:, None] + part * w[:, None], m_new, l_i * alpha + w


@triton.jit
def _merged_rows(part_out_ptr, part_lse_ptr, first_row, num_rows, head_ok,
                 stride_pr, stride_ph, stride_lr, stride_lh,
                 BLOCK_H: tl.constexpr, BLOCK_DV: tl.constexpr):  # fmt: skip
    """The normalised merge of partial rows ``[first_row, first_row + num_rows)``, in that
    fixed order (so the result does not depend on which split arrived last)."""
    local = tl.arange(0, BLOCK_H)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
    for row in range(first_row, first_row + num_rows):
        acc, m_i, l_i = _merge_step(acc, m_i, l_i, part_out_ptr, part_lse_ptr, row, local,
                                    head_ok, stride_pr, stride_ph, stride_lr, stride_lh,
                                    BLOCK_DV)  # fmt: skip
    return acc / tl.where(l_i > 0, l_i, 1.0)[:, None]


# -- split grid ------------------------------------------------------------------------------


@triton.jit
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, seq_lens_ptr,
    out_ptr, part_out_ptr, part_lse_ptr, counter_ptr, k_desc, v_desc,
    qk_scale,
    group_size, num_splits,
    stride_qb, stride_qh,
    stride_kp, stride_ks, stride_kh,
    stride_vp, stride_vs, stride_vh,
    stride_bt,
    stride_ob, stride_oh,
    stride_pr, stride_ph,
    stride_lr, stride_lh,
    head_dim: tl.constexpr, v_head_dim: tl.constexpr, PAGE_SIZE: tl.constexpr,
    SPLIT_KV: tl.constexpr, FUSED_MERGE: tl.constexpr, USE_TMA: tl.constexpr,
    CARRY_PAGES: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    PDL_WAIT: tl.constexpr, PDL_TRIGGER: tl.constexpr,
):  # fmt: skip
    pdl_prologue(PDL_WAIT, PDL_TRIGGER)
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_kv_heads = tl.num_programs(1)

    heads = kv_head * group_size + tl.arange(0, BLOCK_H)
    head_ok = tl.arange(0, BLOCK_H) < group_size
    d = tl.arange(0, BLOCK_D)

    seq_len = tl.load(seq_lens_ptr + b)
    per_split = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
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
    acc, m_i, l_i = _attend_range(
        acc, m_i, l_i, q, start, full_end, end, b, kv_head,
        k_cache_ptr, v_cache_ptr, block_table_ptr, k_desc, v_desc,
        stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt,
        qk_scale, USE_TMA, CARRY_PAGES, DOT_PRECISION, head_dim, v_head_dim, PAGE_SIZE,
        BLOCK_N, BLOCK_D, BLOCK_DV,
    )  # fmt: skip

    if not SPLIT_KV:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        _store_out(out_ptr, b, heads, head_ok, stride_ob, stride_oh, out, v_head_dim, BLOCK_DV)
    else:
        # Partial rows are (request, KV head, split)-major, one row per program.
        group_row = b * num_kv_heads + kv_head
        _store_partial(
            part_out_ptr, part_lse_ptr, group_row * num_splits + split,
            heads - kv_head * group_size, head_ok, acc, m_i, l_i,
            stride_pr, stride_ph, stride_lr, stride_lh, v_head_dim, BLOCK_DV,
        )  # fmt: skip
        if FUSED_MERGE:
            if last_arrival(counter_ptr + group_row, num_splits):
                out = _merged_rows(
                    part_out_ptr, part_lse_ptr, group_row * num_splits, num_splits, head_ok,
                    stride_pr, stride_ph, stride_lr, stride_lh, BLOCK_H, BLOCK_DV,
                )  # fmt: skip
                _store_out(out_ptr, b, heads, head_ok, stride_ob, stride_oh, out,
                           v_head_dim, BLOCK_DV)  # fmt: skip


@triton.jit
def _decode_merge_kernel(
    part_out_ptr, part_lse_ptr, out_ptr,
    group_size, num_splits,
    stride_pr, stride_ph,
    stride_lr, stride_lh,
    stride_ob, stride_oh,
    v_head_dim: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    """One query head of one request: combine its ``num_splits`` partials (second launch)."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    kv_head = h // group_size
    first_row = (b * (tl.num_programs(1) // group_size) + kv_head) * num_splits
    local = h - kv_head * group_size
    s = tl.arange(0, BLOCK_S)
    dv = tl.arange(0, BLOCK_DV)
    s_ok = s < num_splits
    rows = first_row + s
    lse = tl.load(part_lse_ptr + rows * stride_lr + local * stride_lh, mask=s_ok,
                  other=float("-inf"))  # fmt: skip
    m = tl.max(lse, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.where(s_ok & (lse > float("-inf")), tl.exp2(lse - m_safe), 0.0)
    parts = tl.load(
        part_out_ptr + rows[:, None] * stride_pr + local * stride_ph + dv[None, :],
        mask=s_ok[:, None] & (dv[None, :] < v_head_dim),
        other=0.0,
    )
    total = tl.sum(w, axis=0)
    out = tl.sum(parts * w[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + dv, out.to(out_ptr.dtype.element_ty),
             mask=dv < v_head_dim)  # fmt: skip


# -- host side -------------------------------------------------------------------------------


def arrival_counters(device: torch.device, count: int) -> torch.Tensor:
    """Zeroed int32 counters for the fused merge (``arrival.zeroed_buffer``), reset by the
    kernels."""
    return zeroed_buffer("decode_merge_counters", device, count)


def tma_available(*caches: torch.Tensor) -> bool:
    """Whether TMA descriptors can address these caches: an NVIDIA GPU of sm_90 or newer (or
    the interpreter, which emulates them) and 16-byte aligned base addresses and strides."""
    device = caches[0].device
    if device.type == "cuda" and (
        torch.version.hip is not None or torch.cuda.get_device_capability(device) < (9, 0)
    ):
        return False
    return all(
        c.data_ptr() % 16 == 0 and all(st * c.element_size() % 16 == 0 for st in c.stride()[:-1])
        for c in caches
    )


def _tma_descriptors(
    k_cache: torch.Tensor, v_cache: torch.Tensor, block_n: int, block_d: int, block_dv: int
) -> tuple[Any, Any]:
    """Host TMA descriptors over the 4-D caches, one ``[1, block_n, 1, D]`` box per tile."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    def desc(cache: torch.Tensor, inner: int) -> Any:
        return TensorDescriptor(cache, list(cache.shape), list(cache.stride()),
                                [1, block_n, 1, inner])  # fmt: skip

    return desc(k_cache, block_d), desc(v_cache, block_dv)


def _check_config(cfg: Mapping[str, Any], page_size: int) -> None:
    if cfg.get("tma") and page_size % int(cfg["block_n"]):
        raise ValueError(f"tma decode needs page_size % block_n == 0 (got {page_size}, "
                         f"{cfg['block_n']})")  # fmt: skip
    if cfg.get("merge", "kernel") not in ("kernel", "fused"):
        raise ValueError(f"unknown decode merge {cfg['merge']!r}; expected 'kernel' or 'fused'")


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
    page_size = k_cache.shape[1]
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("paged decode needs unit stride along head_dim")
    if not config:
        config = decode_default_config(
            {
                "head_dim": head_dim,
                "v_head_dim": v_head_dim,
                "batch": batch,
                "num_kv_heads": num_kv_heads,
                "kv_len": block_tables.shape[1] * page_size,
                "page_size": page_size,
            }
        )
    _check_config(config, page_size)
    out = torch.empty((batch, num_q_heads, v_head_dim), dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    block_n = int(config["block_n"])
    block_d, block_dv = triton.next_power_of_2(head_dim), triton.next_power_of_2(v_head_dim)
    launch = {
        "q": q, "k_cache": k_cache, "v_cache": v_cache, "block_tables": block_tables,
        "seq_lens": seq_lens, "out": out, "qk_scale": scale * _LOG2E,
        "group": num_q_heads // num_kv_heads, "block_n": block_n, "block_d": block_d,
        "block_dv": block_dv, "descs": (None, None),
        "carry_pages": config.get("carry_pages", False),
    }  # fmt: skip
    use_tma = bool(config.get("tma")) and tma_available(k_cache, v_cache)
    if use_tma:
        launch["descs"] = _tma_descriptors(k_cache, v_cache, block_n, block_d, block_dv)
    _launch_split(launch, config, use_tma)
    return out


def _common_args(a: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Cache strides and constexprs of the split kernel."""
    k, v, q = a["k_cache"], a["v_cache"], a["q"]
    strides = (
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        a["block_tables"].stride(0),
        a["out"].stride(0), a["out"].stride(1),
    )  # fmt: skip
    consts = {
        "head_dim": q.shape[-1], "v_head_dim": v.shape[-1], "PAGE_SIZE": k.shape[1],
        "DOT_PRECISION": dot_precision(q.dtype), "CARRY_PAGES": bool(a["carry_pages"]),
        "BLOCK_H": max(16, triton.next_power_of_2(a["group"])), "BLOCK_N": a["block_n"],
        "BLOCK_D": a["block_d"], "BLOCK_DV": a["block_dv"],
    }  # fmt: skip
    return strides, consts


def _launch_options(config: Mapping[str, Any]) -> dict[str, int]:
    """Warps, stages and (optional) ``maxnreg``: a register cap that trades a few spills for
    one more resident program per SM."""
    opts = {"num_warps": int(config["num_warps"]), "num_stages": int(config["num_stages"])}
    if config.get("maxnreg"):
        opts["maxnreg"] = int(config["maxnreg"])
    return opts


def _partials(rows: int, block_h: int, block_dv: int, device: torch.device):
    part_out = torch.empty((rows, block_h, block_dv), dtype=torch.float32, device=device)
    part_lse = torch.empty((rows, block_h), dtype=torch.float32, device=device)
    return part_out, part_lse


def _launch_split(a: Mapping[str, Any], config: Mapping[str, Any], use_tma: bool) -> None:
    q, out = a["q"], a["out"]
    batch, num_q_heads = q.shape[:2]
    num_kv_heads = a["k_cache"].shape[2]
    splits = int(config["num_splits"])
    fused = splits > 1 and config.get("merge", "kernel") == "fused"
    strides, consts = _common_args(a)
    if splits > 1:
        part_out, part_lse = _partials(batch * num_kv_heads * splits, consts["BLOCK_H"],
                                       a["block_dv"], q.device)  # fmt: skip
    else:
        part_out, part_lse = out, out  # unused
    counters = arrival_counters(q.device, batch * num_kv_heads) if fused else out
    k_desc, v_desc = a["descs"]
    pdl = pdl_mode(config, q.device)
    _decode_split_kernel[(batch, num_kv_heads, splits)](
        q, a["k_cache"], a["v_cache"], a["block_tables"], a["seq_lens"],
        out, part_out, part_lse, counters, k_desc, v_desc,
        a["qk_scale"], a["group"], splits,
        q.stride(0), q.stride(1),
        *strides,
        part_out.stride(0), part_out.stride(1) if splits > 1 else 0,
        part_lse.stride(0), part_lse.stride(1) if splits > 1 else 0,
        SPLIT_KV=splits > 1, FUSED_MERGE=fused, USE_TMA=use_tma,
        **_launch_options(config), **pdl_constexprs(pdl), **pdl_launch_options(pdl),
        **consts,
    )  # fmt: skip
    if splits > 1 and not fused:
        _decode_merge_kernel[(batch, num_q_heads)](
            part_out, part_lse, out,
            a["group"], splits,
            part_out.stride(0), part_out.stride(1),
            part_lse.stride(0), part_lse.stride(1),
            out.stride(0), out.stride(1),
            v_head_dim=a["v_cache"].shape[-1], BLOCK_S=triton.next_power_of_2(splits),
            BLOCK_DV=a["block_dv"], num_warps=4,
        )  # fmt: skip
