"""Fused MoE experts in Triton: tokens grouped by expert, two grouped GEMMs.

The sorted path (``path="sorted"``, the default of more than 16 tokens):

1. ``align_by_expert`` orders the (token, slot) pairs by expert and pads each expert's run to
   a multiple of ``BLOCK_M``, so every block of ``BLOCK_M`` sorted rows belongs to one expert.
   ``align="torch"`` does it with ~10 device-side torch ops; ``align="triton"`` with one
   single-program kernel (histogram, padded prefix sums, per-expert slot counters), which
   removes most of their fixed launch latency (the default up to 2048 pairs).
2. ``_gate_up_kernel``: per block, ``x[rows] @ W_gate^T`` and ``x[rows] @ W_up^T`` side by
   side, then ``silu(gate) * up`` is written once (the ``2I``-wide intermediate never hits
   memory).
3. ``_down_kernel``: per block, ``act[rows] @ W2^T`` scaled by the routing weight, into one
   row per pair; the ``top_k`` rows of a token are summed in float32 afterwards (a plain
   reduction rather than atomics, so results are deterministic): by torch (``reduce="torch"``:
   two launches) or one Triton kernel (``reduce="triton"``).

The sort-free path (``path="sortfree"``, the default up to 16 tokens): no alignment at all.
The grid has one program row per pair; a program whose pair is the *first* occurrence of its
expert in ``topk_ids`` gathers every pair routed to that expert (a compare over the few ids)
and runs the expert's tile; the others exit at once. Every selected expert's weights are still
read exactly once. Its tile has one row per token (``block_m``, default the next power of
two of the token count, at least 16), so past 16 tokens most rows are masked.

The down projection can also run token-major (``down="token"``): one program per (token,
``down_block_n`` output columns) walks the token's ``top_k`` experts as a GEMV and writes the
output row directly (no per-pair rows, no reduction launch). It reads an expert's ``W2`` once
per token that chose it, so it suits batches where tokens rarely share experts (the default
while the pairs are at most half the experts: 1-8 tokens at 128 experts, top-8).

Every path reads ``w2`` through its strides, stored ``[E, H, I]`` or ``[E, I, H]`` (a transposed
view, as the runtime keeps it); ``path="onepass"`` (``fused_moe_onepass.py``: both projections
in one launch, up to 8 tokens) needs the latter.

Launch-config keys (absent: sorted path, torch alignment and sum, expert-major down):
``block_m``, ``block_n``, ``block_k``, ``num_warps``, ``num_stages`` (gate/up),
``down_block_n``, ``down_block_k``, ``down_num_warps``, ``down_num_stages``, ``align``,
``reduce``, ``path``, ``down``.
``configs.moe_default_config`` chooses from the token count and the expert count only.

The sorted grids have static upper bounds, ``cdiv(T*k, BLOCK_M) + min(E, T*k)`` blocks; blocks
past the real count read an out-of-range expert id and exit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from .common import dot_precision
from .configs import moe_default_config
from .fused_moe_onepass import fused_moe_onepass

# The single-program alignment kernel holds every pair id in registers.
ALIGN_MAX_PAIRS = 16384


def align_by_expert(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted pair ids padded per expert (padding = ``T*k``) and each block's expert id.

    Blocks past the used ones get expert id ``num_experts`` (meaning: skip).
    """
    flat = topk_ids.reshape(-1).to(torch.int64)
    pairs = flat.numel()
    device = flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # bincount without a host sync
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    padded_start = padded_end - padded
    count_start = torch.cumsum(counts, 0) - counts
    order = torch.argsort(flat, stable=True)
    experts_sorted = flat[order]
    rank = torch.arange(pairs, device=device) - count_start[experts_sorted]
    num_blocks = _num_blocks(pairs, num_experts, block_m)
    sorted_ids = torch.full((num_blocks * block_m,), pairs, dtype=torch.int32, device=device)
    sorted_ids[padded_start[experts_sorted] + rank] = order.to(torch.int32)
    block_starts = torch.arange(num_blocks, device=device) * block_m
    block_expert = torch.searchsorted(padded_end, block_starts, right=True)
    return sorted_ids, block_expert.to(torch.int32)


def _num_blocks(pairs: int, num_experts: int, block_m: int) -> int:
    return triton.cdiv(pairs, block_m) + min(num_experts, pairs)


def _topk_block(top_k: int) -> int:
    """Register block of one token's expert slots: at least 8, because Triton 3.6 fails to
    lower the ``[16, 2]`` / ``[16, 4]`` match tensors of small top-k (found compiling for
    sm_90a); the extra slots are masked."""
    return max(8, triton.next_power_of_2(top_k))


def _pairs_block(pairs: int) -> int:
    """Register block holding every pair id: at least 64, so that 1-8 tokens at top-8 share
    one compiled kernel (the compare over 64 ids costs nothing next to the weight stream)."""
    return max(64, triton.next_power_of_2(pairs))


@triton.jit
def _align_kernel(
    ids_ptr, sorted_ids_ptr, block_expert_ptr, cursor_ptr,
    num_pairs, num_experts, num_blocks,
    BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_NB: tl.constexpr,
):  # fmt: skip
    """One program: the same result as ``align_by_expert`` up to the order inside an expert.

    Each pair takes its slot from a per-expert cursor (global atomics, initialised to the
    expert's padded start), so rows of one expert land in arbitrary order; every row of a GEMM
    block is computed independently, so the MoE output does not depend on that order. The CTA
    barriers order the padding fill and the cursor init before the scatter.
    """
    i = tl.arange(0, BLOCK_P)
    ok = i < num_pairs
    expert = tl.load(ids_ptr + i, mask=ok, other=0)
    counts = tl.histogram(expert, BLOCK_E, mask=ok)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    padded_end = tl.cumsum(padded, axis=0)
    e = tl.arange(0, BLOCK_E)
    tl.store(cursor_ptr + e, padded_end - padded)

    for b0 in range(0, num_blocks, BLOCK_NB):  # chunks keep the compare matrix small
        blk = b0 + tl.arange(0, BLOCK_NB)
        owner = tl.sum((padded_end[None, :] <= (blk * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + blk, tl.minimum(owner, num_experts), mask=blk < num_blocks)
    for s0 in range(0, num_blocks * BLOCK_M, BLOCK_P):
        slot = s0 + i
        tl.store(sorted_ids_ptr + slot, tl.full([BLOCK_P], 0, tl.int32) + num_pairs,
                 mask=slot < num_blocks * BLOCK_M)  # fmt: skip
    tl.debug_barrier()
    dest = tl.atomic_add(cursor_ptr + expert, 1, mask=ok, sem="relaxed", scope="cta")
    tl.store(sorted_ids_ptr + dest, i, mask=ok)


def align_by_expert_triton(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``align_by_expert`` in one launch (up to ``ALIGN_MAX_PAIRS`` pairs)."""
    flat = topk_ids.reshape(-1)
    if flat.dtype != torch.int32:
        flat = flat.to(torch.int32)
    pairs = flat.numel()
    if pairs > ALIGN_MAX_PAIRS:
        return align_by_expert(topk_ids, num_experts, block_m)
    num_blocks = _num_blocks(pairs, num_experts, block_m)
    device = flat.device
    sorted_ids = torch.empty(num_blocks * block_m, dtype=torch.int32, device=device)
    block_expert = torch.empty(num_blocks, dtype=torch.int32, device=device)
    block_e = triton.next_power_of_2(num_experts)
    cursors = torch.empty(block_e, dtype=torch.int32, device=device)
    block_p = _pairs_block(pairs)  # bucketed: one compile serves a range of batch sizes
    _align_kernel[(1,)](
        flat, sorted_ids, block_expert, cursors,
        pairs, num_experts, num_blocks,
        BLOCK_M=block_m, BLOCK_P=block_p, BLOCK_E=block_e,
        BLOCK_NB=max(16, min(64, 4096 // block_e)), num_warps=8 if pairs > 1024 else 4,
    )  # fmt: skip
    return sorted_ids, block_expert


# -- GEMM tiles shared by the sorted and sort-free kernels -----------------------------------


@triton.jit
def _gate_up_tile(
    x_ptr, w_base, token, row_ok, n, hidden, inter, stride_xt, stride_wn,
    DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    """``silu(x[token] @ Wg[n]^T) * (x[token] @ Wu[n]^T)`` for one expert, float32."""
    n_ok = n < inter
    kk = tl.arange(0, BLOCK_K)
    gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        k_ok = (k0 + kk) < hidden
        a = tl.load(
            x_ptr + token[:, None] * stride_xt + (k0 + kk)[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        w_off = (k0 + kk)[:, None] + n[None, :] * stride_wn  # [BLOCK_K, BLOCK_N]
        w_mask = k_ok[:, None] & n_ok[None, :]
        wg = tl.load(w_base + w_off, mask=w_mask, other=0.0)
        wu = tl.load(w_base + inter * stride_wn + w_off, mask=w_mask, other=0.0)
        gate = tl.dot(a, wg, gate, input_precision=DOT_PRECISION)
        up = tl.dot(a, wu, up, input_precision=DOT_PRECISION)
    return gate * tl.sigmoid(gate) * up


@triton.jit
def _down_tile(
    act_ptr, w_base, rows, row_ok, n, hidden, inter, stride_act, stride_wn, stride_wk,
    DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    """``act[rows] @ W2[n]^T`` for one expert, float32."""
    n_ok = n < hidden
    kk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        k_ok = (k0 + kk) < inter
        a = tl.load(
            act_ptr + rows[:, None] * stride_act + (k0 + kk)[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        w = tl.load(
            w_base + (k0 + kk)[:, None] * stride_wk + n[None, :] * stride_wn,
            mask=k_ok[:, None] & n_ok[None, :],
            other=0.0,
        )
        acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def _store_act(act_ptr, pair, row_ok, n, inter, stride_act, act):
    tl.store(
        act_ptr + pair[:, None].to(tl.int64) * stride_act + n[None, :],
        act.to(act_ptr.dtype.element_ty),
        mask=row_ok[:, None] & (n[None, :] < inter),
    )


@triton.jit
def _store_weighted(out_ptr, weights_ptr, rows, row_ok, n, hidden, stride_out, acc):
    weight = tl.load(weights_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(
        out_ptr + rows[:, None] * stride_out + n[None, :],
        (acc * weight[:, None]).to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & (n[None, :] < hidden),
    )


# -- sorted path -----------------------------------------------------------------------------


@triton.jit
def _gate_up_kernel(
    x_ptr, w13_ptr, act_ptr, sorted_ids_ptr, block_expert_ptr,
    num_pairs, num_experts, hidden, inter, top_k,
    stride_xt, stride_we, stride_wn, stride_act,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    expert = tl.load(block_expert_ptr + block).to(tl.int64)
    if expert < num_experts:
        pair = tl.load(sorted_ids_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
        row_ok = pair < num_pairs
        token = (pair // top_k).to(tl.int64)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        act = _gate_up_tile(
            x_ptr, w13_ptr + expert * stride_we, token, row_ok, n, hidden, inter,
            stride_xt, stride_wn, DOT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K,
        )  # fmt: skip
        _store_act(act_ptr, pair, row_ok, n, inter, stride_act, act)


@triton.jit
def _down_kernel(
    act_ptr, w2_ptr, out_ptr, weights_ptr, sorted_ids_ptr, block_expert_ptr,
    num_pairs, num_experts, hidden, inter,
    stride_act, stride_we, stride_wn, stride_wk, stride_out,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    expert = tl.load(block_expert_ptr + block).to(tl.int64)
    if expert < num_experts:
        pair = tl.load(sorted_ids_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
        row_ok = pair < num_pairs
        rows = pair.to(tl.int64)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = _down_tile(
            act_ptr, w2_ptr + expert * stride_we, rows, row_ok, n, hidden, inter,
            stride_act, stride_wn, stride_wk, DOT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K,
        )  # fmt: skip
        _store_weighted(out_ptr, weights_ptr, rows, row_ok, n, hidden, stride_out, acc)


# -- sort-free path --------------------------------------------------------------------------


@triton.jit
def _owns_expert(ids_ptr, p, num_pairs, BLOCK_P: tl.constexpr):
    """Pair ``p``'s expert, and whether ``p`` is that expert's first pair (its owner)."""
    j = tl.arange(0, BLOCK_P)
    ids = tl.load(ids_ptr + j, mask=j < p, other=-1)
    expert = tl.load(ids_ptr + p)
    return expert.to(tl.int64), tl.sum((ids == expert).to(tl.int32), axis=0) == 0


@triton.jit
def _expert_match(ids_ptr, expert, chunk, num_tokens, top_k,
                  BLOCK_M: tl.constexpr, BLOCK_TOPK: tl.constexpr):  # fmt: skip
    """Which slots of tokens ``chunk * BLOCK_M + [0, BLOCK_M)`` chose ``expert``.

    Rows are tokens, not sorted pairs: no compaction, and the masked rows' loads read nothing.
    Returns the ``[BLOCK_M, BLOCK_TOPK]`` match, its running count along the slots, and the
    most times one token chose the expert (1 for a proper top-k; 0 if no token did).
    """
    t = chunk * BLOCK_M + tl.arange(0, BLOCK_M)
    j = tl.arange(0, BLOCK_TOPK)
    ok = (t[:, None] < num_tokens) & (j[None, :] < top_k)
    ids = tl.load(ids_ptr + t[:, None] * top_k + j[None, :], mask=ok, other=-1)
    match = ids == expert
    seen = tl.cumsum(match.to(tl.int32), axis=1)
    return match, seen, tl.max(tl.max(seen, axis=1), axis=0)


@triton.jit
def _occurrence_rows(match, seen, occurrence, chunk, top_k,
                     BLOCK_M: tl.constexpr, BLOCK_TOPK: tl.constexpr):  # fmt: skip
    """Pair id and validity per token row: its ``occurrence``-th slot holding the expert."""
    t = chunk * BLOCK_M + tl.arange(0, BLOCK_M)
    j = tl.arange(0, BLOCK_TOPK)
    pick = match & (seen == occurrence + 1)
    row_ok = tl.sum(pick.to(tl.int32), axis=1) > 0
    slot = tl.sum(tl.where(pick, j[None, :], 0), axis=1)
    return t * top_k + slot, row_ok


@triton.jit
def _sortfree_gate_up_tiles(
    x_ptr, w13_ptr, act_ptr, ids_ptr, expert, n_tile,
    num_tokens, hidden, inter, top_k, stride_xt, stride_we, stride_wn, stride_act,
    DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_TOPK: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Gate/up columns ``n_tile`` of one expert for every pair routed to it.

    One GEMM per chunk of ``BLOCK_M`` tokens that holds any such pair (one chunk when
    ``BLOCK_M >= T``), and per repeat of the expert within a token (none for a real top-k).
    """
    n = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    for chunk in range(0, tl.cdiv(num_tokens, BLOCK_M)):
        match, seen, repeats = _expert_match(ids_ptr, expert, chunk, num_tokens, top_k,
                                             BLOCK_M, BLOCK_TOPK)  # fmt: skip
        for occurrence in range(0, repeats):
            pair, row_ok = _occurrence_rows(match, seen, occurrence, chunk, top_k, BLOCK_M,
                                            BLOCK_TOPK)  # fmt: skip
            act = _gate_up_tile(
                x_ptr, w13_ptr + expert * stride_we, (pair // top_k).to(tl.int64), row_ok, n,
                hidden, inter, stride_xt, stride_wn, DOT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K,
            )  # fmt: skip
            _store_act(act_ptr, pair, row_ok, n, inter, stride_act, act)


@triton.jit
def _sortfree_gate_up_kernel(
    x_ptr, w13_ptr, act_ptr, ids_ptr,
    num_pairs, num_tokens, hidden, inter, top_k,
    stride_xt, stride_we, stride_wn, stride_act,
    DOT_PRECISION: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_TOPK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    expert, owner = _owns_expert(ids_ptr, tl.program_id(0), num_pairs, BLOCK_P)
    if owner:
        _sortfree_gate_up_tiles(
            x_ptr, w13_ptr, act_ptr, ids_ptr, expert, tl.program_id(1),
            num_tokens, hidden, inter, top_k, stride_xt, stride_we, stride_wn, stride_act,
            DOT_PRECISION, BLOCK_M, BLOCK_TOPK, BLOCK_N, BLOCK_K,
        )  # fmt: skip


@triton.jit
def _sortfree_down_kernel(
    act_ptr, w2_ptr, out_ptr, weights_ptr, ids_ptr,
    num_pairs, num_tokens, hidden, inter, top_k,
    stride_act, stride_we, stride_wn, stride_wk, stride_out,
    DOT_PRECISION: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_TOPK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    expert, owner = _owns_expert(ids_ptr, tl.program_id(0), num_pairs, BLOCK_P)
    if owner:
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        for chunk in range(0, tl.cdiv(num_tokens, BLOCK_M)):
            match, seen, repeats = _expert_match(ids_ptr, expert, chunk, num_tokens, top_k,
                                                 BLOCK_M, BLOCK_TOPK)  # fmt: skip
            for occurrence in range(0, repeats):
                pair, row_ok = _occurrence_rows(match, seen, occurrence, chunk, top_k,
                                                BLOCK_M, BLOCK_TOPK)  # fmt: skip
                rows = pair.to(tl.int64)
                acc = _down_tile(
                    act_ptr, w2_ptr + expert * stride_we, rows, row_ok, n, hidden, inter,
                    stride_act, stride_wn, stride_wk, DOT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K,
                )  # fmt: skip
                _store_weighted(out_ptr, weights_ptr, rows, row_ok, n, hidden, stride_out, acc)


# -- token-major down projection and the top-k reduction -------------------------------------


@triton.jit
def _token_down_tile(
    act_ptr, w2_ptr, out_ptr, weights_ptr, ids_ptr, t, n_tile,
    hidden, inter, top_k,
    stride_act, stride_we, stride_wn, stride_wk, stride_out,
    NUM_STAGES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """``out[t, n] = sum_j w_tj * act[t*k+j] . W2[e_tj, n]``: a GEMV over the token's experts.

    One flat pipelined loop over (expert slot, K chunk); float32 accumulation in a fixed order.
    Activations are read with ``.cg`` (they may have been written by this launch). Its tiles
    run along I: with ``w2`` stored [E, I, H] it is correct but slow (docs/kernels.md).
    """
    t = t.to(tl.int64)
    n = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < hidden
    kk = tl.arange(0, BLOCK_K)
    chunks = tl.cdiv(inter, BLOCK_K)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for it in tl.range(0, top_k * chunks, num_stages=NUM_STAGES):
        j = it // chunks
        k0 = (it - j * chunks) * BLOCK_K
        pair = t * top_k + j
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        weight = tl.load(weights_ptr + pair).to(tl.float32)
        k_ok = (k0 + kk) < inter
        a = tl.load(act_ptr + pair * stride_act + k0 + kk, mask=k_ok, other=0.0,
                    cache_modifier=".cg")  # fmt: skip
        w = tl.load(
            w2_ptr + expert * stride_we + n[:, None] * stride_wn + (k0 + kk)[None, :] * stride_wk,
            mask=n_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        acc += weight * tl.sum(w.to(tl.float32) * a.to(tl.float32)[None, :], axis=1)
    tl.store(out_ptr + t * stride_out + n, acc.to(out_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _token_down_kernel(
    act_ptr, w2_ptr, out_ptr, weights_ptr, ids_ptr,
    hidden, inter, top_k,
    stride_act, stride_we, stride_wn, stride_wk, stride_out,
    NUM_STAGES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    _token_down_tile(
        act_ptr, w2_ptr, out_ptr, weights_ptr, ids_ptr, tl.program_id(0), tl.program_id(1),
        hidden, inter, top_k, stride_act, stride_we, stride_wn, stride_wk, stride_out,
        NUM_STAGES, BLOCK_N, BLOCK_K,
    )  # fmt: skip


@triton.jit
def _topk_sum_kernel(
    pair_out_ptr, out_ptr, hidden, top_k, stride_pair, stride_out, BLOCK_N: tl.constexpr
):
    """``out[t] = sum_j pair_out[t*k + j]`` in float32, in slot order (deterministic)."""
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < hidden
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for j in range(top_k):
        acc += tl.load(pair_out_ptr + (t * top_k + j) * stride_pair + n, mask=n_ok).to(tl.float32)
    tl.store(out_ptr + t * stride_out + n, acc.to(out_ptr.dtype.element_ty), mask=n_ok)


# -- host side -------------------------------------------------------------------------------


def _check_config(cfg: Mapping[str, Any]) -> None:
    choices = {
        "align": ("torch", "triton"), "reduce": ("torch", "triton"),
        "path": ("sorted", "sortfree", "onepass"), "down": ("expert", "token"),
    }  # fmt: skip
    for key, allowed in choices.items():
        if cfg.get(key, allowed[0]) not in allowed:
            raise ValueError(f"fused_moe {key}={cfg[key]!r}; expected one of {allowed}")


def _launch_opts(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, int]:
    warps = cfg.get(f"{prefix}num_warps", cfg["num_warps"])
    stages = cfg.get(f"{prefix}num_stages", cfg["num_stages"])
    return {"num_warps": int(warps), "num_stages": int(stages)}


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    config: Mapping[str, Any] | None = None,
) -> torch.Tensor:
    """Triton fused SiLU-gated experts; see ``tokenspeed.kernels.fused_moe``."""
    tokens, hidden = x.shape
    num_experts, two_inter, _ = w13.shape
    inter = two_inter // 2
    top_k = topk_ids.shape[1]
    if x.stride(-1) != 1 or w13.stride(-1) != 1 or 1 not in w2.stride()[1:]:
        raise ValueError(
            "fused_moe needs x and w13 contiguous along hidden, and w2 stored [E, H, I] or "
            "[E, I, H] (unit stride along one of its last two dims)"
        )
    if tokens == 0:
        return torch.empty_like(x)
    cfg = dict(
        config
        or moe_default_config({"num_tokens": tokens, "top_k": top_k, "num_experts": num_experts})
    )
    _check_config(cfg)
    pairs = tokens * top_k
    ids = topk_ids.reshape(-1)
    weights = topk_weights.reshape(-1).to(torch.float32)
    if cfg.get("path") == "onepass":
        ids = ids if ids.dtype == torch.int32 else ids.to(torch.int32)
        return fused_moe_onepass(x, w13, w2, weights, ids, top_k, cfg)
    act = torch.empty((pairs, inter), dtype=x.dtype, device=x.device)
    if cfg.get("path", "sorted") == "sortfree":
        ids = ids if ids.dtype == torch.int32 else ids.to(torch.int32)
        blocks = None
        _sortfree_gate_up(x, w13, act, ids, top_k, cfg)
    else:
        blocks = _sorted_gate_up(x, w13, act, topk_ids, top_k, cfg)
    if cfg.get("down", "expert") == "token":
        return _token_down(act, w2, weights, ids, tokens, top_k, x.dtype, cfg)
    pair_out = torch.empty((pairs, hidden), dtype=x.dtype, device=x.device)
    if blocks is None:
        _sortfree_down(act, w2, pair_out, weights, ids, top_k, cfg)
    else:
        _sorted_down(act, w2, pair_out, weights, blocks, cfg)
    return _sum_top_k(pair_out, tokens, top_k, x.dtype, cfg)


def _sorted_gate_up(
    x: Tensor, w13: Tensor, act: Tensor, topk_ids: Tensor, top_k: int, cfg: Mapping[str, Any]
) -> tuple[Tensor, Tensor]:
    num_experts, hidden, inter = w13.shape[0], x.shape[1], act.shape[1]
    block_m = int(cfg["block_m"])
    align = align_by_expert_triton if cfg.get("align", "torch") == "triton" else align_by_expert
    sorted_ids, block_expert = align(topk_ids, num_experts, block_m)
    _gate_up_kernel[(block_expert.numel(), triton.cdiv(inter, int(cfg["block_n"])))](
        x, w13, act, sorted_ids, block_expert,
        act.shape[0], num_experts, hidden, inter, top_k,
        x.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
        DOT_PRECISION=dot_precision(x.dtype), BLOCK_M=block_m,
        BLOCK_N=int(cfg["block_n"]), BLOCK_K=int(cfg["block_k"]), **_launch_opts(cfg),
    )  # fmt: skip
    return sorted_ids, block_expert


def _sorted_down(
    act: Tensor,
    w2: Tensor,
    pair_out: Tensor,
    weights: Tensor,
    blocks: tuple[Tensor, Tensor],
    cfg: Mapping[str, Any],
) -> None:
    sorted_ids, block_expert = blocks
    hidden, inter = w2.shape[1], act.shape[1]
    # The down projection may take its own tile (its K is the short intermediate dim).
    down_n = int(cfg.get("down_block_n", cfg["block_n"]))
    _down_kernel[(block_expert.numel(), triton.cdiv(hidden, down_n))](
        act, w2, pair_out, weights, sorted_ids, block_expert,
        act.shape[0], w2.shape[0], hidden, inter,
        act.stride(0), w2.stride(0), w2.stride(1), w2.stride(2), pair_out.stride(0),
        DOT_PRECISION=dot_precision(act.dtype), BLOCK_M=int(cfg["block_m"]), BLOCK_N=down_n,
        BLOCK_K=int(cfg.get("down_block_k", cfg["block_k"])), **_launch_opts(cfg, "down_"),
    )  # fmt: skip


def _sortfree_block_m(pairs: int, top_k: int, cfg: Mapping[str, Any]) -> int:
    """Token rows per sort-free tile: every token in one tile (one GEMM per expert) by default."""
    return int(cfg.get("block_m", max(16, triton.next_power_of_2(pairs // top_k))))


def _sortfree_gate_up(
    x: Tensor, w13: Tensor, act: Tensor, ids: Tensor, top_k: int, cfg: Mapping[str, Any]
) -> None:
    pairs, inter = act.shape
    block_n = int(cfg["block_n"])
    _sortfree_gate_up_kernel[(pairs, triton.cdiv(inter, block_n))](
        x, w13, act, ids,
        pairs, x.shape[0], x.shape[1], inter, top_k,
        x.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
        DOT_PRECISION=dot_precision(x.dtype), BLOCK_P=_pairs_block(pairs),
        BLOCK_TOPK=_topk_block(top_k),
        BLOCK_M=_sortfree_block_m(pairs, top_k, cfg), BLOCK_N=block_n,
        BLOCK_K=int(cfg["block_k"]), **_launch_opts(cfg),
    )  # fmt: skip


def _sortfree_down(
    act: Tensor,
    w2: Tensor,
    pair_out: Tensor,
    weights: Tensor,
    ids: Tensor,
    top_k: int,
    cfg: Mapping[str, Any],
) -> None:
    pairs, inter = act.shape
    hidden = w2.shape[1]
    down_n = int(cfg.get("down_block_n", cfg["block_n"]))
    _sortfree_down_kernel[(pairs, triton.cdiv(hidden, down_n))](
        act, w2, pair_out, weights, ids,
        pairs, pairs // top_k, hidden, inter, top_k,
        act.stride(0), w2.stride(0), w2.stride(1), w2.stride(2), pair_out.stride(0),
        DOT_PRECISION=dot_precision(act.dtype), BLOCK_P=_pairs_block(pairs),
        BLOCK_TOPK=_topk_block(top_k),
        BLOCK_M=_sortfree_block_m(pairs, top_k, cfg), BLOCK_N=down_n,
        BLOCK_K=int(cfg.get("down_block_k", cfg["block_k"])), **_launch_opts(cfg, "down_"),
    )  # fmt: skip


def _token_down(
    act: Tensor,
    w2: Tensor,
    weights: Tensor,
    ids: Tensor,
    tokens: int,
    top_k: int,
    dtype: torch.dtype,
    cfg: Mapping[str, Any],
) -> Tensor:
    hidden, inter = w2.shape[1], act.shape[1]
    out = torch.empty((tokens, hidden), dtype=dtype, device=act.device)
    down_n = int(cfg.get("down_block_n", 16))
    opts = _launch_opts(cfg, "down_")
    _token_down_kernel[(tokens, triton.cdiv(hidden, down_n))](
        act, w2, out, weights, ids,
        hidden, inter, top_k,
        act.stride(0), w2.stride(0), w2.stride(1), w2.stride(2), out.stride(0),
        NUM_STAGES=opts["num_stages"], BLOCK_N=down_n,
        BLOCK_K=int(cfg.get("down_block_k", 256)), num_warps=opts["num_warps"],
    )  # fmt: skip
    return out


def _sum_top_k(
    pair_out: Tensor, tokens: int, top_k: int, dtype: torch.dtype, cfg: Mapping[str, Any]
) -> Tensor:
    if top_k == 1:
        return pair_out
    hidden = pair_out.shape[1]
    if cfg.get("reduce", "torch") != "triton":
        return pair_out.view(tokens, top_k, hidden).sum(dim=1, dtype=torch.float32).to(dtype)
    out = torch.empty((tokens, hidden), dtype=dtype, device=pair_out.device)
    block = min(1024, triton.next_power_of_2(hidden))
    _topk_sum_kernel[(tokens, triton.cdiv(hidden, block))](
        pair_out, out, hidden, top_k, pair_out.stride(0), out.stride(0),
        BLOCK_N=block, num_warps=4,
    )  # fmt: skip
    return out
