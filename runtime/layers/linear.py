"""Linear layers whose parameters know how to load checkpoint tensors.

Checkpoints store q/k/v and gate/up as separate matrices; we keep them stacked so each step
runs one GEMM instead of three. A stacked parameter carries a ``weight_loader`` that copies a
named shard into its slice of the rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from tokenspeed.runtime.model_loader.errors import ModelLoadError


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """Copy a checkpoint tensor into a parameter, refusing silent shape mismatches."""
    if tuple(param.shape) != tuple(loaded.shape):
        raise ModelLoadError(
            f"weight shape mismatch: checkpoint {tuple(loaded.shape)} vs model {tuple(param.shape)}"
        )
    with torch.no_grad():
        param.copy_(loaded)


class Linear(nn.Module):
    """``y = x W^T (+ b)``; a plain projection (o_proj, down_proj, router, lm_head)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class MergedLinear(Linear):
    """Several projections of the same input stacked along the output rows (qkv, gate_up)."""

    def __init__(
        self, in_features: int, shard_sizes: Sequence[int], shard_names: Sequence[str], bias: bool
    ) -> None:
        super().__init__(in_features, sum(shard_sizes), bias=bias)
        if len(shard_sizes) != len(shard_names):
            raise ValueError("one name per shard")
        offsets = [0]
        for size in shard_sizes:
            offsets.append(offsets[-1] + size)
        self.shard_slices = {
            name: (offsets[i], offsets[i + 1]) for i, name in enumerate(shard_names)
        }
        self.shard_sizes = list(shard_sizes)
        for param in (self.weight, self.bias):
            if param is not None:
                param.weight_loader = self._load_shard  # type: ignore[attr-defined]
                param.expected_shards = frozenset(shard_names)  # type: ignore[attr-defined]

    def _load_shard(self, param: nn.Parameter, loaded: torch.Tensor, shard: str) -> None:
        start, end = self.shard_slices[shard]
        default_weight_loader(param.data[start:end], loaded)  # type: ignore[arg-type]

    def forward_split(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Run the stacked GEMM and return one view per shard."""
        return list(self.forward(x).split(self.shard_sizes, dim=-1))
