"""MoE routing (softmax, sigmoid + correction bias, grouped) and SiLU-gated experts."""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick ``top_k`` experts per token and their weights.

    Scores are ``softmax`` or ``sigmoid`` of the logits. Selection uses scores plus the
    correction bias; weights are the unbiased scores of the chosen experts (DeepSeek-V3
    noaux_tc). With ``n_group``, experts form equal groups; a group's score is its best
    selection score (softmax) or the sum of its best two (sigmoid), and only the best
    ``topk_group`` groups are eligible. Weights are renormalised to sum to one when asked,
    then multiplied by ``routed_scaling_factor``. Ids come in descending selection score.
    """
    logits = router_logits.float()
    if scoring == "softmax":
        scores = torch.softmax(logits, dim=-1)
    elif scoring == "sigmoid":
        scores = torch.sigmoid(logits)
    else:
        raise ValueError(f"unknown scoring {scoring!r}; expected 'softmax' or 'sigmoid'")
    choice = scores if correction_bias is None else scores + correction_bias.float()
    if n_group is not None and n_group > 1:
        tokens, experts = choice.shape
        grouped = choice.view(tokens, n_group, experts // n_group)
        if scoring == "sigmoid":
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
        else:
            group_scores = grouped.amax(dim=-1)
        best_groups = group_scores.topk(topk_group or n_group, dim=-1).indices
        allowed = torch.zeros_like(group_scores, dtype=torch.bool)
        allowed.scatter_(1, best_groups, True)
        allowed = allowed.repeat_interleave(experts // n_group, dim=1)
        choice = choice.masked_fill(~allowed, float("-inf"))
    topk_ids = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, topk_ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * routed_scaling_factor, topk_ids.to(torch.int32)


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """``sum_j w_j * (silu(x W_gate^T) * (x W_up^T)) W2^T`` over each token's experts.

    ``w13[E, 2I, H]`` holds gate rows then up rows; ``w2[E, H, I]``. Tokens are grouped
    by expert so each expert runs one matmul (a loop over experts, not tokens).
    """
    tokens, top_k = topk_ids.shape
    flat_ids = topk_ids.reshape(-1).long()
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()
    pair_out = x.new_zeros(tokens * top_k, x.shape[1], dtype=torch.float32)
    for expert, pairs in enumerate(torch.split(order, counts)):
        if pairs.numel() == 0:
            continue
        h = x[pairs // top_k].float() @ w13[expert].float().t()
        gate, up = h.chunk(2, dim=-1)
        pair_out[pairs] = (F.silu(gate) * up) @ w2[expert].float().t()
    weighted = pair_out.view(tokens, top_k, -1) * topk_weights.float().unsqueeze(-1)
    return weighted.sum(dim=1).to(x.dtype)
