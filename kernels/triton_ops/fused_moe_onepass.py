"""Fused MoE for a few tokens in one pass over the weights (``path="onepass"``).

At one token the experts are two GEMVs, and splitting them into two dependent launches costs a
ramp-up and a tail each: the second launch cannot start streaming ``W2`` before the first has
written every activation. Here each program takes a few *intermediate rows* of one (token,
expert) pair at a time and does both products for them: the gate and up rows times ``x`` give
those rows' activations, which at once scale the same rows of the expert's down projection.
So the whole call is one stream over the touched weights with no dependency between programs.

That needs the down rows of one intermediate index contiguous: ``w2`` is passed as the usual
``[E, H, I]`` view but stored ``[E, I, H]`` (``w2.stride(1) == 1``). Each program keeps its
share of the output in float32 registers, adds it into a zeroed float32 workspace with
atomics, and the last program to finish (``arrival.last_arrival``) converts the rows, writes
the output and zeroes the workspace again. Summation order across programs is therefore not
fixed: results may differ in the last bits from call to call.

Config keys: ``block_i`` (intermediate rows per step), ``num_warps``, ``num_stages``,
``programs`` (the persistent grid; default one per SM), ``evict_first`` (weights loaded
with the L2 evict-first hint: each is read once), ``pdl`` (``pdl.py``; on by default here),
``row_acc`` (one token: the down rows accumulate per row, one multiply-add per weight, and are
summed over the rows once at the end; on by default, 4 warps need it) and,
for benchmarks only, ``ablation`` (``"no_tail"``: no workspace sums and no last-arrival step;
``"loads_only"``: the weights summed instead of multiplied; both give wrong outputs).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .arrival import last_arrival, zeroed_buffer
from .configs import MOE_ONEPASS_MAX_TILE as ONEPASS_MAX_TILE
from .pdl import pdl_constexprs, pdl_launch_options, pdl_mode, pdl_prologue

# Tokens one launch handles: each program keeps [BLOCK_T, hidden] float32 partial outputs.
ONEPASS_MAX_TOKENS = 8


@triton.jit
def _onepass_kernel(
    x_ptr, w13_ptr, w2_ptr, ids_ptr, weights_ptr, acc_ptr, counter_ptr, out_ptr,
    num_tokens, hidden, inter, top_k, num_items, chunks,
    stride_xt, stride_w13e, stride_w13n, stride_w2e, stride_w2k, stride_acc, stride_out,
    BLOCK_T: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr,
    NUM_STAGES: tl.constexpr, EVICT: tl.constexpr, ROW_ACC: tl.constexpr,
    PDL_WAIT: tl.constexpr, PDL_TRIGGER: tl.constexpr, ABLATION: tl.constexpr,
):  # fmt: skip
    """Items are (pair, ``BLOCK_I`` intermediate rows), dealt round-robin to the programs.

    An expert chosen by several of the tokens is read once per pair (reading it once for all
    of them measured 1.2-1.9x slower at 2-4 tokens: docs/kernels.md).
    """
    pdl_prologue(PDL_WAIT, PDL_TRIGGER)
    h = tl.arange(0, BLOCK_H)
    h_ok = h < hidden
    i = tl.arange(0, BLOCK_I)
    t_rows = tl.arange(0, BLOCK_T)
    acc = tl.zeros([BLOCK_T, BLOCK_H], dtype=tl.float32)
    # One token: x is the same for every item, and the down rows accumulate per row (one
    # multiply-add per weight), summed over the rows once after the loop.
    ONE_TOKEN: tl.constexpr = BLOCK_T == 1 and ROW_ACC
    if ONE_TOKEN:
        x_once = tl.load(x_ptr + h, mask=h_ok, other=0.0).to(tl.float32)
        acc_rows = tl.zeros([BLOCK_I, BLOCK_H], dtype=tl.float32)
    for item in tl.range(tl.program_id(0), num_items, tl.num_programs(0), num_stages=NUM_STAGES):
        pair = item // chunks
        rows = (item - pair * chunks) * BLOCK_I + i
        token = pair // top_k
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        weight = tl.load(weights_ptr + pair)
        mask = (rows < inter)[:, None] & h_ok[None, :]
        if ONE_TOKEN:
            x = x_once
        else:
            x = tl.load(x_ptr + token * stride_xt + h, mask=h_ok, other=0.0).to(tl.float32)
        w13 = w13_ptr + expert * stride_w13e + rows[:, None] * stride_w13n + h[None, :]
        gate_w = tl.load(w13, mask=mask, other=0.0, eviction_policy=EVICT)
        up_w = tl.load(w13 + inter * stride_w13n, mask=mask, other=0.0, eviction_policy=EVICT)
        down_w = tl.load(
            w2_ptr + expert * stride_w2e + rows[:, None] * stride_w2k + h[None, :],
            mask=mask, other=0.0, eviction_policy=EVICT,
        )  # fmt: skip
        if ABLATION == 2:  # the weights summed instead of multiplied: loads alone
            rows_out = gate_w.to(tl.float32) + up_w.to(tl.float32) + down_w.to(tl.float32)
        else:
            gate = tl.sum(gate_w.to(tl.float32) * x[None, :], axis=1)
            up = tl.sum(up_w.to(tl.float32) * x[None, :], axis=1)
            act = gate * tl.sigmoid(gate) * up * weight
            rows_out = act[:, None] * down_w.to(tl.float32)
        if ONE_TOKEN:
            acc_rows += rows_out
        else:
            acc += tl.where(t_rows[:, None] == token, tl.sum(rows_out, axis=0)[None, :], 0.0)
    if ONE_TOKEN:
        acc = tl.sum(acc_rows, axis=0)[None, :]
    rows_ok = (t_rows < num_tokens)[:, None] & h_ok[None, :]
    if ABLATION != 0:
        tl.store(out_ptr + t_rows[:, None] * stride_out + h[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=rows_ok)  # fmt: skip
        return
    acc_ptrs = acc_ptr + t_rows[:, None] * stride_acc + h[None, :]
    tl.atomic_add(acc_ptrs, acc, mask=rows_ok, sem="relaxed", scope="gpu")
    if last_arrival(counter_ptr, tl.num_programs(0)):
        total = tl.load(acc_ptrs, mask=rows_ok, other=0.0, cache_modifier=".cg")
        tl.store(out_ptr + t_rows[:, None] * stride_out + h[None, :],
                 total.to(out_ptr.dtype.element_ty), mask=rows_ok)  # fmt: skip
        tl.store(acc_ptrs, tl.zeros([BLOCK_T, BLOCK_H], dtype=tl.float32), mask=rows_ok)


def onepass_applies(tokens: int, hidden: int, w2: torch.Tensor) -> bool:
    """Whether the one-pass kernel can run: few tokens and ``w2`` stored ``[E, I, H]``."""
    return 0 < tokens <= ONEPASS_MAX_TOKENS and w2.stride(1) == 1 and hidden <= ONEPASS_MAX_TILE


def _programs(device: torch.device, items: int, cfg: Mapping[str, Any]) -> int:
    if "programs" in cfg:
        return max(1, min(items, int(cfg["programs"])))
    sms = (
        torch.cuda.get_device_properties(device).multi_processor_count
        if device.type == "cuda"
        else 4
    )
    return max(1, min(items, sms))


def fused_moe_onepass(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    top_k: int,
    cfg: Mapping[str, Any],
) -> torch.Tensor:
    """``fused_moe`` in one launch for ``T <= ONEPASS_MAX_TOKENS`` tokens (flat float32
    ``weights`` and int32 ``ids`` per pair); ``w2`` must be stored ``[E, I, H]``."""
    tokens, hidden = x.shape
    inter = w2.shape[2]
    if not onepass_applies(tokens, hidden, w2):
        raise ValueError(
            f"the one-pass MoE needs 1-{ONEPASS_MAX_TOKENS} tokens, hidden <= "
            f"{ONEPASS_MAX_TILE} and w2 stored [E, I, H] (w2.stride(1) == 1); got {tokens} "
            f"tokens, hidden {hidden}, w2 strides {tuple(w2.stride())}"
        )
    block_h = triton.next_power_of_2(hidden)
    block_i = int(cfg.get("block_i", max(1, min(16, ONEPASS_MAX_TILE // block_h // 2))))
    chunks = triton.cdiv(inter, block_i)
    items = tokens * top_k * chunks
    block_t = triton.next_power_of_2(tokens)
    acc = zeroed_buffer("moe_onepass_acc", x.device, ONEPASS_MAX_TOKENS * hidden, torch.float32)
    counter = zeroed_buffer("moe_onepass_counter", x.device, 1)
    out = torch.empty_like(x)
    pdl = pdl_mode(cfg, x.device, default="early")
    _onepass_kernel[(_programs(x.device, items, cfg),)](
        x, w13, w2, ids, weights, acc, counter, out,
        tokens, hidden, inter, top_k, items, chunks,
        x.stride(0), w13.stride(0), w13.stride(1), w2.stride(0), w2.stride(2), hidden,
        out.stride(0),
        BLOCK_T=block_t, BLOCK_I=block_i, BLOCK_H=block_h,
        NUM_STAGES=int(cfg.get("num_stages", 3)),
        ROW_ACC=bool(cfg.get("row_acc", True)),
        EVICT="evict_first" if cfg.get("evict_first") else "",
        num_warps=int(cfg.get("num_warps", 8)),
        **pdl_constexprs(pdl), **pdl_launch_options(pdl),
        ABLATION={"": 0, "no_tail": 1, "loads_only": 2}[cfg.get("ablation", "")],
    )  # fmt: skip
    return out
