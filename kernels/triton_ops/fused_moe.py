"""Fused MoE experts in Triton: tokens sorted by expert, two grouped GEMMs.

1. ``align_by_expert`` (device-side torch ops, no host sync) orders the (token, slot) pairs
   by expert and pads each expert's run to a multiple of ``BLOCK_M``, so every block of
   ``BLOCK_M`` sorted rows belongs to one expert.
2. ``_gate_up_kernel``: per block, ``x[rows] @ W_gate^T`` and ``x[rows] @ W_up^T`` side by
   side, then ``silu(gate) * up`` is written once (the ``2I``-wide intermediate never hits
   memory).
3. ``_down_kernel``: per block, ``act[rows] @ W2^T`` scaled by the routing weight, into one
   row per pair; the ``top_k`` rows of a token are summed in float32 afterwards (a plain
   reduction rather than atomics, so results are deterministic).

The launch config may give the down projection its own ``down_block_n``/``down_block_k``
(decode-sized batches split the gate/up weights into narrower N tiles than the down ones, so
each touched expert's weight stream is shared by more programs).

The grids have static upper bounds, ``cdiv(T*k, BLOCK_M) + min(E, T*k)`` blocks; blocks past
the real count read an out-of-range expert id and exit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .common import dot_precision
from .configs import moe_default_config


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
    num_blocks = triton.cdiv(pairs, block_m) + min(num_experts, pairs)
    sorted_ids = torch.full((num_blocks * block_m,), pairs, dtype=torch.int32, device=device)
    sorted_ids[padded_start[experts_sorted] + rank] = order.to(torch.int32)
    block_starts = torch.arange(num_blocks, device=device) * block_m
    block_expert = torch.searchsorted(padded_end, block_starts, right=True)
    return sorted_ids, block_expert.to(torch.int32)


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
        n_ok = n < inter
        kk = tl.arange(0, BLOCK_K)
        w_base = w13_ptr + expert * stride_we
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
        act = gate * tl.sigmoid(gate) * up
        tl.store(
            act_ptr + pair[:, None].to(tl.int64) * stride_act + n[None, :],
            act.to(act_ptr.dtype.element_ty),
            mask=row_ok[:, None] & n_ok[None, :],
        )


@triton.jit
def _down_kernel(
    act_ptr, w2_ptr, out_ptr, weights_ptr, sorted_ids_ptr, block_expert_ptr,
    num_pairs, num_experts, hidden, inter,
    stride_act, stride_we, stride_wn, stride_out,
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
        n_ok = n < hidden
        kk = tl.arange(0, BLOCK_K)
        w_base = w2_ptr + expert * stride_we
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, inter, BLOCK_K):
            k_ok = (k0 + kk) < inter
            a = tl.load(
                act_ptr + rows[:, None] * stride_act + (k0 + kk)[None, :],
                mask=row_ok[:, None] & k_ok[None, :],
                other=0.0,
            )
            w = tl.load(
                w_base + (k0 + kk)[:, None] + n[None, :] * stride_wn,
                mask=k_ok[:, None] & n_ok[None, :],
                other=0.0,
            )
            acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
        weight = tl.load(weights_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        acc = acc * weight[:, None]
        tl.store(
            out_ptr + rows[:, None] * stride_out + n[None, :],
            acc.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & n_ok[None, :],
        )


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
    if x.stride(-1) != 1 or w13.stride(-1) != 1 or w2.stride(-1) != 1:
        raise ValueError("fused_moe needs unit stride along the reduction dims")
    if tokens == 0:
        return torch.empty_like(x)
    cfg = dict(
        config
        or moe_default_config({"num_tokens": tokens, "top_k": top_k, "num_experts": num_experts})
    )
    block_m, block_n, block_k = int(cfg["block_m"]), int(cfg["block_n"]), int(cfg["block_k"])
    launch = {"num_warps": int(cfg["num_warps"]), "num_stages": int(cfg["num_stages"])}
    precision = dot_precision(x.dtype)
    pairs = tokens * top_k
    sorted_ids, block_expert = align_by_expert(topk_ids, num_experts, block_m)
    num_blocks = block_expert.numel()
    weights = topk_weights.reshape(-1).to(torch.float32)

    act = torch.empty((pairs, inter), dtype=x.dtype, device=x.device)
    _gate_up_kernel[(num_blocks, triton.cdiv(inter, block_n))](
        x, w13, act, sorted_ids, block_expert,
        pairs, num_experts, hidden, inter, top_k,
        x.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
        DOT_PRECISION=precision, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        **launch,
    )  # fmt: skip
    pair_out = torch.empty((pairs, hidden), dtype=x.dtype, device=x.device)
    # The down projection may take its own tile (its K is the short intermediate dim).
    down_n = int(cfg.get("down_block_n", block_n))
    down_k = int(cfg.get("down_block_k", block_k))
    _down_kernel[(num_blocks, triton.cdiv(hidden, down_n))](
        act, w2, pair_out, weights, sorted_ids, block_expert,
        pairs, num_experts, hidden, inter,
        act.stride(0), w2.stride(0), w2.stride(1), pair_out.stride(0),
        DOT_PRECISION=precision, BLOCK_M=block_m, BLOCK_N=down_n, BLOCK_K=down_k,
        **launch,
    )  # fmt: skip
    if top_k == 1:
        return pair_out
    return pair_out.view(tokens, top_k, hidden).sum(dim=1, dtype=torch.float32).to(x.dtype)
