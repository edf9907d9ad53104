"""Small helpers shared by the Triton kernels' launchers."""

from __future__ import annotations

import torch


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` input precision: exact IEEE for float32 tensors (no silent TF32), else tf32
    (which only matters for float32 operands, so half-precision dots are unaffected)."""
    return "ieee" if dtype == torch.float32 else "tf32"
