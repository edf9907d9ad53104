"""Rotary position embedding, applied in place (neox and GPT-J layouts, partial rotary)."""

from __future__ import annotations

import torch


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    """Rotate ``x[T, H, rot_dim]`` (float32) by per-token ``cos``/``sin`` ``[T, 1, rot_dim/2]``."""
    if is_neox:
        x1, x2 = x.chunk(2, dim=-1)
    else:
        x1, x2 = x[..., 0::2], x[..., 1::2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    if is_neox:
        return torch.cat((o1, o2), dim=-1)
    return torch.stack((o1, o2), dim=-1).flatten(-2)


def _rotate_float32_in_place(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool
) -> None:
    """``_rotate`` written straight into a float32 ``x`` (same products and rounding, no cat)."""
    if is_neox:
        x1, x2 = x.chunk(2, dim=-1)
    else:
        x1, x2 = x[..., 0::2], x[..., 1::2]
    x1_sin, x2_sin = x1 * sin, x2 * sin
    x1.mul_(cos).sub_(x2_sin)  # x1 cos - x2 sin
    x2.mul_(cos).add_(x1_sin)  # x2 cos + x1 sin


def apply_rotary_emb(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first ``rot_dim`` dims of ``q[T,Hq,D]`` and ``k[T,Hk,D]`` in place.

    ``cos_sin_cache[max_pos, rot_dim]`` holds cos in its first half and sin in its second.
    """
    rot_dim = cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache.index_select(0, positions.long()).float().chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    for t in (q, k):
        if t.dtype == torch.float32:
            _rotate_float32_in_place(t[..., :rot_dim], cos, sin, is_neox)
        else:
            t[..., :rot_dim] = _rotate(t[..., :rot_dim].float(), cos, sin, is_neox).to(t.dtype)
    return q, k
