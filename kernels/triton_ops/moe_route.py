"""MoE top-k routing in Triton: one program per token, all experts in registers.

Scores (softmax or sigmoid), the selection bias, group limiting (DeepSeek style: keep the
best ``topk_group`` of ``n_group`` groups, a group scored by its best expert for softmax or
its best two for sigmoid), top-k by repeated argmax, renormalisation and scaling, all in
one pass over the token's logits. Grouping needs a power-of-two expert count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .configs import route_default_config


@triton.jit
def _route_kernel(
    logits_ptr, bias_ptr, weights_ptr, ids_ptr,
    num_experts, stride_logits, stride_w, stride_ids, scaling,
    TOP_K: tl.constexpr, SIGMOID: tl.constexpr, HAS_BIAS: tl.constexpr,
    RENORMALIZE: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    e_ok = e < num_experts
    logits = tl.load(logits_ptr + token * stride_logits + e, mask=e_ok, other=float("-inf"))
    logits = logits.to(tl.float32)
    if SIGMOID:
        scores = tl.where(e_ok, tl.sigmoid(logits), 0.0)
    else:
        z = tl.exp(logits - tl.max(logits, axis=0))
        scores = z / tl.sum(z, axis=0)
    choice = scores
    if HAS_BIAS:
        choice = choice + tl.load(bias_ptr + e, mask=e_ok, other=0.0).to(tl.float32)
    choice = tl.where(e_ok, choice, float("-inf"))

    if N_GROUP > 1:
        GROUP: tl.constexpr = BLOCK_E // N_GROUP
        grouped = tl.reshape(choice, (N_GROUP, GROUP))
        best = tl.max(grouped, axis=1)
        if SIGMOID:
            col = tl.arange(0, GROUP)
            first = tl.argmax(grouped, axis=1)
            rest = tl.where(col[None, :] == first[:, None], float("-inf"), grouped)
            best = best + tl.max(rest, axis=1)
        g = tl.arange(0, N_GROUP)
        keep = tl.zeros([N_GROUP], dtype=tl.int1)
        for _ in tl.static_range(TOPK_GROUP):
            pick = tl.argmax(best, axis=0)
            keep = keep | (g == pick)
            best = tl.where(g == pick, float("-inf"), best)
        allowed = tl.reshape(tl.broadcast_to(keep[:, None], (N_GROUP, GROUP)), (BLOCK_E,))
        choice = tl.where(allowed, choice, float("-inf"))

    k = tl.arange(0, BLOCK_K)
    top_w = tl.zeros([BLOCK_K], dtype=tl.float32)
    top_i = tl.zeros([BLOCK_K], dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        pick = tl.argmax(choice, axis=0)
        w = tl.sum(tl.where(e == pick, scores, 0.0), axis=0)
        top_w = tl.where(k == j, w, top_w)
        top_i = tl.where(k == j, pick.to(tl.int32), top_i)
        choice = tl.where(e == pick, float("-inf"), choice)
    if RENORMALIZE:
        top_w = top_w / tl.sum(top_w, axis=0)
    top_w = top_w * scaling
    k_ok = k < TOP_K
    tl.store(weights_ptr + token * stride_w + k, top_w, mask=k_ok)
    tl.store(ids_ptr + token * stride_ids + k, top_i, mask=k_ok)


def moe_route(
    router_logits: torch.Tensor,
    top_k: int,
    *,
    scoring: str = "softmax",
    renormalize: bool,
    correction_bias: torch.Tensor | None = None,
    n_group: int | None = None,
    topk_group: int | None = None,
    routed_scaling_factor: float = 1.0,
    config: Mapping[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton top-k routing; see ``tokenspeed.kernels.moe_route``."""
    tokens, num_experts = router_logits.shape
    if router_logits.stride(-1) != 1:
        router_logits = router_logits.contiguous()
    groups = n_group if n_group is not None and n_group > 1 else 1
    block_e = triton.next_power_of_2(num_experts)
    if groups > 1 and (block_e != num_experts or groups & (groups - 1)):
        raise ValueError("grouped routing needs power-of-two expert and group counts")
    cfg = dict(config or route_default_config({"num_experts": num_experts}))
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=router_logits.device)
    ids = torch.empty((tokens, top_k), dtype=torch.int32, device=router_logits.device)
    if tokens:
        bias = correction_bias if correction_bias is not None else weights
        _route_kernel[(tokens,)](
            router_logits, bias, weights, ids,
            num_experts, router_logits.stride(0), weights.stride(0), ids.stride(0),
            float(routed_scaling_factor),
            TOP_K=top_k, SIGMOID=scoring == "sigmoid", HAS_BIAS=correction_bias is not None,
            RENORMALIZE=bool(renormalize), N_GROUP=groups, TOPK_GROUP=topk_group or groups,
            BLOCK_E=block_e, BLOCK_K=triton.next_power_of_2(top_k),
            num_warps=int(cfg["num_warps"]),
        )  # fmt: skip
    return weights, ids
