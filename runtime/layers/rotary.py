"""Rotary position embedding: a precomputed cos/sin table per scaling scheme.

The table is ``[max_positions, rot_dim]`` (cos half then sin half), the layout the kernels'
``apply_rotary_emb`` reads. Frequencies are computed in float32 the way the original
implementations do, so positions rotate bit-for-bit like the reference models.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from tokenspeed import kernels
from tokenspeed.runtime.model_loader.errors import ModelLoadError


def _base_inv_freq(base: float, dim: int) -> torch.Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    return 1.0 / (base**exponents)


def _llama3_inv_freq(inv_freq: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """Llama 3.x: keep high frequencies, divide low ones by ``factor``, blend the middle band."""
    factor = float(params["factor"])
    low = float(params.get("low_freq_factor", 1.0))
    high = float(params.get("high_freq_factor", 4.0))
    old_len = float(params["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    low_wavelen, high_wavelen = old_len / low, old_len / high
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(
    base: float, dim: int, params: dict[str, Any], max_position_embeddings: int
) -> tuple[torch.Tensor, float]:
    """YaRN: interpolate low frequencies, extrapolate high ones, ramp between; scale cos/sin."""
    orig = int(params.get("original_max_position_embeddings") or max_position_embeddings)
    factor = params.get("factor")
    factor = float(factor) if factor is not None else max_position_embeddings / orig
    attn_factor = params.get("attention_factor")
    if attn_factor is None:
        mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all:
            attn_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
        else:
            attn_factor = _yarn_mscale(factor)
    beta_fast = float(params.get("beta_fast") or 32)
    beta_slow = float(params.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(torch.float32) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # 1 = extrapolate (high frequency), 0 = interpolate
    inv_freq = interpolation * (1 - keep) + extrapolation * keep
    return inv_freq, float(attn_factor)


def build_cos_sin_cache(
    head_dim: int, rope: dict[str, Any], max_positions: int, max_position_embeddings: int
) -> tuple[torch.Tensor, int]:
    """Return the float32 ``[max_positions, rot_dim]`` table and ``rot_dim``."""
    base = float(rope.get("rope_theta", 10000.0))
    rot_dim = int(head_dim * float(rope.get("partial_rotary_factor", 1.0)))
    kind = rope.get("rope_type", "default")
    positions = torch.arange(max_positions, dtype=torch.int64).to(torch.float32)
    scale = 1.0
    if kind == "default":
        inv_freq = _base_inv_freq(base, rot_dim)
    elif kind == "linear":
        inv_freq = _base_inv_freq(base, rot_dim) / float(rope["factor"])
    elif kind == "llama3":
        inv_freq = _llama3_inv_freq(_base_inv_freq(base, rot_dim), rope)
    elif kind == "yarn":
        inv_freq, scale = _yarn_inv_freq(base, rot_dim, rope, max_position_embeddings)
    else:
        raise ModelLoadError(
            f"unsupported rope_type {kind!r} (supported: default, linear, llama3, yarn)"
        )
    freqs = torch.outer(positions, inv_freq)
    cache = torch.cat([freqs.cos() * scale, freqs.sin() * scale], dim=-1)
    return cache, rot_dim


class RotaryEmbedding(nn.Module):
    """Applies RoPE in place to q/k through ``kernels.apply_rotary_emb``."""

    def __init__(
        self,
        head_dim: int,
        rope: dict[str, Any],
        max_positions: int,
        max_position_embeddings: int,
        is_neox: bool = True,
    ) -> None:
        super().__init__()
        cache, self.rot_dim = build_cos_sin_cache(
            head_dim, rope, max_positions, max_position_embeddings
        )
        self.is_neox = is_neox
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return kernels.apply_rotary_emb(q, k, positions, self.cos_sin_cache, self.is_neox)
