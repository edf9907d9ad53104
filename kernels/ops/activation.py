"""``silu_and_mul``."""

from __future__ import annotations

import torch

from ..selection import dispatch
from ..traits import bucket
from ._common import fmt


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[:, :I]) * x[:, I:]`` for ``x[T, 2I]``."""
    sel = dispatch(
        "activation",
        "silu_and_mul",
        x.device,
        {"x": fmt(x)},
        {"intermediate": x.shape[-1] // 2, "num_tokens": bucket(x.numel() // max(x.shape[-1], 1))},
    )
    return sel.run(x)
