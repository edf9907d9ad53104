"""SiLU-and-mul in Triton: one read of ``x[T, 2I]``, one write of ``[T, I]``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .configs import silu_default_config


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, inter, stride_x, stride_out, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
    y = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, *, config: Mapping[str, Any] | None = None) -> torch.Tensor:
    """Triton ``silu(x[:, :I]) * x[:, I:]``; see ``tokenspeed.kernels.silu_and_mul``."""
    inter = x.shape[-1] // 2
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    cfg = dict(config or silu_default_config({"intermediate": inter}))
    out = torch.empty((rows, inter), dtype=x.dtype, device=x.device)
    if rows:
        grid = (rows, triton.cdiv(inter, cfg["block_n"]))
        _silu_and_mul_kernel[grid](
            x2, out, inter, x2.stride(0), out.stride(0),
            BLOCK_N=cfg["block_n"], num_warps=cfg["num_warps"],
        )  # fmt: skip
    return out.view(*x.shape[:-1], inter)
