"""The attention layer models call; it knows its shape, the backend does the work."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from tokenspeed.runtime.forward_batch import ForwardBatch


class Attention(nn.Module):
    """Paged GQA attention for one layer; K/V go to this layer's slice of the KV pool."""

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, layer_id: int, scale: float
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.layer_id = layer_id
        self.scale = scale

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        """``q [T, Hq*D]`` or ``[T,Hq,D]`` (k, v likewise) -> ``[T, Hq*D]``."""
        t = q.shape[0]
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        backend = batch.extras["attn_backend"]
        out = backend.forward(q, k, v, self, batch)
        return out.reshape(t, self.num_heads * self.head_dim)
