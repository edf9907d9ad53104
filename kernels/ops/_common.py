"""Helpers the op wrappers share."""

from __future__ import annotations

import torch

_DTYPE_NAMES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float64: "float64",
    torch.int32: "int32",
    torch.int64: "int64",
}
if hasattr(torch, "float8_e4m3fn"):
    _DTYPE_NAMES[torch.float8_e4m3fn] = "float8_e4m3fn"
    _DTYPE_NAMES[torch.float8_e5m2] = "float8_e5m2"


def fmt(t: torch.Tensor) -> str:
    """The format name of a tensor in kernel signatures (its dtype, e.g. ``bfloat16``)."""
    name = _DTYPE_NAMES.get(t.dtype)
    return name if name is not None else str(t.dtype).removeprefix("torch.")
