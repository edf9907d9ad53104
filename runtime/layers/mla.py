"""Multi-head latent attention (MLA) for one layer, over the paged latent KV cache.

The cache holds one vector per token, ``[kv_c (kv_lora_rank) | k_pe (rope_dim)]``. Per-head
keys and values come from ``kv_b_proj`` (W_UK rows then W_UV rows per head):
``k_nope = W_UK kv_c``, ``v = W_UV kv_c``, ``key = [k_nope | k_pe]``. Two ways to attend:

* extend/prefill (many query tokens): decompress the request's latents to per-head K/V and
  run ``tokenspeed.mla.mla_prefill`` (compute-bound; the small head dims are cheap);
* decode (one query token): absorb W_UK into the query (``q_lat = q_nope W_UK``, dim
  kv_lora_rank), attend over the latent cache directly with ``tokenspeed.mla.mla_decode``
  (``q_lat . kv_c + q_pe . k_pe`` is exactly ``q . key``), then apply W_UV to the latent
  output. This reads 576 values per cached token instead of ``H * (192 + 128)``.

Scores and softmax scale are identical in both forms, so a request may prefill in one form
and decode in the other. The absorbed weights are prepared once after loading
(``process_weights_after_loading``), not per step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from tokenspeed.runtime.layers.linear import Linear

if TYPE_CHECKING:
    from tokenspeed.runtime.forward_batch import ForwardBatch


class MLAAttention(nn.Module):
    """Latent attention core: owns ``kv_b_proj`` and its absorbed forms; the backend attends."""

    def __init__(
        self,
        num_heads: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        kv_lora_rank: int,
        layer_id: int,
        scale: float,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.kv_lora_rank = kv_lora_rank
        self.layer_id = layer_id
        self.scale = scale
        self.kv_b_proj = Linear(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim))
        # Absorbed per-head matrices, derived from kv_b_proj after loading (not checkpoint state).
        self.register_buffer("w_uk", torch.empty(0), persistent=False)  # [H, nope, R]
        self.register_buffer("w_uv", torch.empty(0), persistent=False)  # [H, R, v]

    def process_weights_after_loading(self) -> None:
        """Split ``kv_b_proj`` per head into W_UK ``[H, nope, R]`` and W_UV^T ``[H, R, v]``."""
        h, nope, r = self.num_heads, self.qk_nope_head_dim, self.kv_lora_rank
        w = self.kv_b_proj.weight.detach().view(h, nope + self.v_head_dim, r)
        self.w_uk = w[:, :nope, :].contiguous()
        self.w_uv = w[:, nope:, :].transpose(1, 2).contiguous()

    def decompress(
        self, kv_c: torch.Tensor, k_pe: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Latents ``kv_c [N, R]``, ``k_pe [N, rope]`` -> ``key [N, H, nope+rope]``, ``value [N, H, v]``."""
        n, h, nope = kv_c.shape[0], self.num_heads, self.qk_nope_head_dim
        kv = self.kv_b_proj(kv_c).view(n, h, nope + self.v_head_dim)
        key = kv.new_empty(n, h, nope + self.qk_rope_head_dim)
        key[..., :nope] = kv[..., :nope]
        key[..., nope:] = k_pe.view(n, 1, self.qk_rope_head_dim)
        return key, kv[..., nope:]

    def absorb_query(self, q: torch.Tensor) -> torch.Tensor:
        """``q [B, H, nope+rope]`` -> latent query ``[B, H, R + rope]`` = ``[q_nope W_UK | q_pe]``."""
        nope = self.qk_nope_head_dim
        q_lat = torch.bmm(q[..., :nope].transpose(0, 1), self.w_uk).transpose(0, 1)
        return torch.cat((q_lat, q[..., nope:]), dim=-1)

    def project_output(self, o_lat: torch.Tensor) -> torch.Tensor:
        """Latent attention output ``[B, H, R]`` -> per-head values ``[B, H, v]`` through W_UV."""
        return torch.bmm(o_lat.transpose(0, 1), self.w_uv).transpose(0, 1)

    def forward(
        self, q: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        """``q [T, H, nope+rope]`` (rope part rotated), ``kv_c [T, R]``, ``k_pe [T, rope]``
        (rotated) -> ``[T, H * v_head_dim]``. The backend stores the new latents."""
        t = q.shape[0]
        backend = batch.extras["attn_backend"]
        if batch.mode.is_decode():
            o_lat = backend.forward_decode(self.absorb_query(q), kv_c, k_pe, self, batch)
            out = self.project_output(o_lat)
        else:
            out = backend.forward_extend(q, kv_c, k_pe, self, batch)
        return out.reshape(t, self.num_heads * self.v_head_dim)
