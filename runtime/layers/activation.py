"""Gated activation for SwiGLU MLPs."""

from __future__ import annotations

import torch
from torch import nn

from tokenspeed import kernels


class SiluAndMul(nn.Module):
    """``silu(gate) * up`` over a stacked ``[T, 2I]`` input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.silu_and_mul(x)
