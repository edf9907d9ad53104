"""``apply_rotary_emb``."""

from __future__ import annotations

import torch

from ..selection import dispatch
from ..traits import bucket
from ._common import fmt


def apply_rotary_emb(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first ``rot_dim`` dims of ``q[T,Hq,D]``/``k[T,Hk,D]`` in place.

    ``cos_sin_cache[max_pos, rot_dim]`` is cos then sin; GPT-J (interleaved) layout when
    ``is_neox`` is false. Returns ``(q, k)``.
    """
    sel = dispatch(
        "rotary",
        "apply",
        q.device,
        {"q": fmt(q), "k": fmt(k), "cos_sin_cache": fmt(cos_sin_cache)},
        {
            "head_dim": q.shape[-1],
            "rot_dim": cos_sin_cache.shape[-1],
            "is_neox": bool(is_neox),
            "num_tokens": bucket(q.shape[0]),
        },
    )
    return sel.run(q, k, positions, cos_sin_cache, is_neox)
