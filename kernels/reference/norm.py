"""RMSNorm and fused residual-add + RMSNorm, computed in float32."""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dim, output in x's dtype."""
    xf = x.float()
    inv_rms = torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + eps)
    return (xf * inv_rms).mul_(weight.float()).to(x.dtype)  # same rounding, one allocation


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual_out = x + residual`` (rounded to x's dtype), ``normed = rms_norm(residual_out)``."""
    residual_out = (x.float() + residual.float()).to(x.dtype)
    return rms_norm(residual_out, weight, eps), residual_out
