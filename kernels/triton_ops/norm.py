"""RMSNorm and fused residual-add + RMSNorm in Triton.

A program normalises ``BLOCK_ROWS`` rows. When the row fits one block (hidden <= 16384,
every real model) it is read once and kept in registers, so the kernel moves exactly the
bytes it must: read x (and residual), write the output (and residual_out).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .configs import norm_default_config


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    num_rows,
    hidden,
    stride_x,
    stride_res,
    stride_out,
    stride_res_out,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_H)
    row_ok = rows < num_rows
    if SINGLE_PASS:
        mask = row_ok[:, None] & (cols[None, :] < hidden)
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + rows[:, None] * stride_res + cols[None, :], mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
            tl.store(res_out_ptr + rows[:, None] * stride_res_out + cols[None, :], x, mask=mask)
        xf = x.to(tl.float32)
        inv_rms = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / hidden + eps)
        w = tl.load(w_ptr + cols, mask=cols < hidden, other=0.0).to(tl.float32)
        y = xf * inv_rms[:, None] * w[None, :]
        tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], y, mask=mask)
    else:
        # Two passes over column chunks (hidden sizes beyond one block): sum of squares
        # (writing residual_out on the way), then scale.
        src_ptr = res_out_ptr if HAS_RESIDUAL else x_ptr
        stride_src = stride_res_out if HAS_RESIDUAL else stride_x
        sq = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
        for start in range(0, hidden, BLOCK_H):
            c = start + cols
            mask = row_ok[:, None] & (c[None, :] < hidden)
            x = tl.load(x_ptr + rows[:, None] * stride_x + c[None, :], mask=mask, other=0.0)
            if HAS_RESIDUAL:
                r = tl.load(res_ptr + rows[:, None] * stride_res + c[None, :], mask=mask, other=0.0)
                x = (x.to(tl.float32) + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
                tl.store(res_out_ptr + rows[:, None] * stride_res_out + c[None, :], x, mask=mask)
            xf = x.to(tl.float32)
            sq += tl.sum(xf * xf, axis=1)
        inv_rms = 1.0 / tl.sqrt(sq / hidden + eps)
        for start in range(0, hidden, BLOCK_H):
            c = start + cols
            mask = row_ok[:, None] & (c[None, :] < hidden)
            x = tl.load(src_ptr + rows[:, None] * stride_src + c[None, :], mask=mask, other=0.0)
            w = tl.load(w_ptr + c, mask=c < hidden, other=0.0).to(tl.float32)
            y = x.to(tl.float32) * inv_rms[:, None] * w[None, :]
            tl.store(out_ptr + rows[:, None] * stride_out + c[None, :], y, mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a 2-D [rows, hidden] view with unit stride along hidden."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _launch(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    config: Mapping[str, Any] | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    hidden = x.shape[-1]
    x2 = _rows(x)
    rows = x2.shape[0]
    cfg = dict(config or norm_default_config({"hidden": hidden, "num_tokens": rows}))
    out = torch.empty((rows, hidden), dtype=x.dtype, device=x.device)
    res2 = _rows(residual) if residual is not None else x2
    res_out = torch.empty_like(out) if residual is not None else out
    block_h = min(triton.next_power_of_2(hidden), cfg.get("max_block_h", 16384))
    block_rows = cfg["block_rows"]
    grid = (triton.cdiv(rows, block_rows),)
    _rms_norm_kernel[grid](
        x2,
        res2,
        weight,
        out,
        res_out,
        rows,
        hidden,
        x2.stride(0),
        res2.stride(0),
        out.stride(0),
        res_out.stride(0),
        eps,
        HAS_RESIDUAL=residual is not None,
        SINGLE_PASS=block_h >= hidden,
        BLOCK_ROWS=block_rows,
        BLOCK_H=block_h,
        num_warps=cfg["num_warps"],
    )
    shape = x.shape
    return out.view(shape), (res_out.view(shape) if residual is not None else None)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, *, config: Mapping[str, Any] | None = None
) -> torch.Tensor:
    """Triton RMSNorm; see ``tokenspeed.kernels.rms_norm``."""
    return _launch(x, None, weight, eps, config)[0]


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    config: Mapping[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton residual add + RMSNorm in one pass; see ``tokenspeed.kernels.fused_add_rms_norm``."""
    normed, residual_out = _launch(x, residual, weight, eps, config)
    return normed, residual_out
