"""RMSNorm as a module over the kernels' ``rms_norm`` / ``fused_add_rms_norm`` ops."""

from __future__ import annotations

import torch
from torch import nn

from tokenspeed import kernels


class RMSNorm(nn.Module):
    """RMSNorm; with a residual it fuses the add (one pass over memory instead of two)."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return kernels.rms_norm(x, self.weight, self.eps)
        return kernels.fused_add_rms_norm(x, residual, self.weight, self.eps)

    def forward_heads(self, x: torch.Tensor) -> torch.Tensor:
        """Per-head norm (Qwen3 q/k norm): ``x`` is ``[T, heads, head_dim]``."""
        shape = x.shape
        return kernels.rms_norm(x.reshape(-1, shape[-1]), self.weight, self.eps).view(shape)
