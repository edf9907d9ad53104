"""``moe_route`` and ``fused_moe``."""

from __future__ import annotations

import torch

from ..selection import dispatch
from ..traits import bucket
from ._common import fmt


def _grouping(num_experts: int, n_group: int) -> str:
    """Group layout trait: "none", "pow2" (power-of-two experts and groups) or "uneven"."""
    if n_group <= 1:
        return "none"
    pow2 = not (num_experts & (num_experts - 1) or n_group & (n_group - 1))
    return "pow2" if pow2 else "uneven"


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
    """Top-k experts per token: ``(topk_weights[T,k] float32, topk_ids[T,k] int32)``.

    ``scoring`` is "softmax" or "sigmoid"; the correction bias only picks experts (weights
    come from unbiased scores); ``n_group``/``topk_group`` restrict picks to the best groups.
    """
    if scoring not in ("softmax", "sigmoid"):
        raise ValueError(f"unknown scoring {scoring!r}; expected 'softmax' or 'sigmoid'")
    num_experts = router_logits.shape[-1]
    grouped = n_group is not None and n_group > 1
    if grouped and num_experts % n_group:
        raise ValueError(f"{num_experts} experts do not split into {n_group} groups")
    sel = dispatch(
        "moe",
        "route",
        router_logits.device,
        {"router_logits": fmt(router_logits)},
        {
            "num_experts": num_experts,
            "top_k": top_k,
            "scoring": scoring,
            "grouping": _grouping(num_experts, n_group if grouped else 1),
            "biased": correction_bias is not None,
            "num_tokens": bucket(router_logits.shape[0]),
        },
    )
    return sel.run(
        router_logits,
        top_k,
        scoring=scoring,
        renormalize=renormalize,
        correction_bias=correction_bias,
        n_group=n_group,
        topk_group=topk_group,
        routed_scaling_factor=routed_scaling_factor,
    )


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """SiLU-gated experts: ``x[T,H]``, ``w13[E,2I,H]`` (gate rows, then up), ``w2[E,H,I]``.

    Returns ``sum_j topk_weights[:, j] * expert_{topk_ids[:, j]}(x)`` as ``[T, H]``. ``w2``
    may be stored either way round (contiguous along I, or a transposed view contiguous
    along H); the ``w2_contiguous`` trait tells the kernels which.
    """
    sel = dispatch(
        "moe",
        "experts",
        x.device,
        {"x": fmt(x), "weights": fmt(w13)},
        {
            "num_experts": w13.shape[0],
            "hidden": x.shape[-1],
            "intermediate": w2.shape[-1],
            "top_k": topk_ids.shape[-1],
            "num_tokens": bucket(x.shape[0]),
            "w2_contiguous": "hidden" if w2.stride(1) == 1 else "intermediate",
        },
    )
    return sel.run(x, w13, w2, topk_weights, topk_ids)
