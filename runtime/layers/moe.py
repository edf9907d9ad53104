"""Mixture-of-experts block: router GEMM, ``kernels.moe_route``, ``kernels.fused_moe``.

Experts are stored stacked — ``w13 [E, 2I, H]`` (gate rows then up rows) and ``w2 [E, H, I]`` —
the shapes ``fused_moe`` reads; ``w2`` is kept in memory as ``[E, I, H]`` (a transposed view),
so the down weights of one intermediate row are contiguous: the one-pass kernel of small
batches streams both projections at once that way. Checkpoints come either per expert
(``experts.{e}.gate_proj.weight``) or already fused (``experts.gate_up_proj``); both load.
"""

from __future__ import annotations

import torch
from torch import nn

from tokenspeed import kernels
from tokenspeed.runtime.layers.linear import Linear, default_weight_loader


class FusedMoE(nn.Module):
    """Routed SwiGLU experts (softmax or sigmoid scoring) over the kernels' fused MoE op."""

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        renormalize: bool,
        scoring: str = "softmax",
    ) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.top_k = top_k
        self.intermediate_size = intermediate_size
        self.renormalize = renormalize
        self.scoring = scoring
        self.gate = Linear(hidden_size, num_experts, bias=False)
        self.w13 = nn.Parameter(
            torch.empty(num_experts, 2 * intermediate_size, hidden_size), requires_grad=False
        )
        self.w2 = nn.Parameter(
            torch.empty(num_experts, intermediate_size, hidden_size).transpose(1, 2),
            requires_grad=False,
        )
        self.w13.weight_loader = self._load_w13  # type: ignore[attr-defined]
        self.w2.weight_loader = self._load_w2  # type: ignore[attr-defined]
        experts = range(num_experts)
        self.w13.expected_shards = frozenset(  # type: ignore[attr-defined]
            f"{e}:{w}" for e in experts for w in ("gate", "up")
        )
        self.w2.expected_shards = frozenset(str(e) for e in experts)  # type: ignore[attr-defined]

    def _load_w13(self, param: nn.Parameter, loaded: torch.Tensor, shard: str) -> None:
        """shard: ``"fused"`` (all experts, gate+up) or ``"{expert}:gate"`` / ``"{expert}:up"``."""
        if shard == "fused":
            default_weight_loader(param, loaded)
            return
        expert, which = shard.split(":")
        rows = slice(0, self.intermediate_size)
        if which == "up":
            rows = slice(self.intermediate_size, 2 * self.intermediate_size)
        default_weight_loader(param.data[int(expert), rows], loaded)  # type: ignore[arg-type]

    def _load_w2(self, param: nn.Parameter, loaded: torch.Tensor, shard: str) -> None:
        if shard == "fused":
            default_weight_loader(param, loaded)
            return
        default_weight_loader(param.data[int(shard)], loaded)  # type: ignore[arg-type]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        router_logits = self.gate(x)
        weights, ids = kernels.moe_route(
            router_logits, self.top_k, scoring=self.scoring, renormalize=self.renormalize
        )
        return kernels.fused_moe(x, self.w13, self.w2, weights, ids)
