"""``rms_norm`` and ``fused_add_rms_norm``."""

from __future__ import annotations

import torch

from ..selection import dispatch
from ..traits import bucket
from ._common import fmt


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of ``x[T, H]``; computed in float32, output in x's dtype."""
    sel = dispatch(
        "norm",
        "rms",
        x.device,
        {"x": fmt(x), "weight": fmt(weight)},
        {"hidden": x.shape[-1], "num_tokens": bucket(x.numel() // max(x.shape[-1], 1))},
    )
    return sel.run(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual_out = x + residual``; returns ``(rms_norm(residual_out), residual_out)``."""
    sel = dispatch(
        "norm",
        "fused_add_rms",
        x.device,
        {"x": fmt(x), "residual": fmt(residual), "weight": fmt(weight)},
        {"hidden": x.shape[-1], "num_tokens": bucket(x.numel() // max(x.shape[-1], 1))},
    )
    return sel.run(x, residual, weight, eps)
