"""Fused latent K/V pack (+ FP8 quantize) and paged-cache store, in Triton.

One kernel serves four ops: it reads ``BLOCK_T`` tokens' ``kv_c[512]`` and ``k_pe[64]`` rows
(any row strides: views of bigger projections work), optionally quantizes them to FP8 e4m3
with a static per-tensor scale or a per-token scale computed from the row's amax, and
writes ``[kv_c | k_pe]`` either to a packed ``[T, 576]`` tensor or to the paged latent cache
at ``slot_mapping`` (negative slots are padding and skipped). This replaces ``cat`` +
``cast`` + ``cast`` (and an index copy) with one read and one write of every value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .configs import pack_default_config

FP8_MAX = 448.0
QUANT_NONE, QUANT_TENSOR, QUANT_TOKEN = 0, 1, 2


@triton.jit
def _round_e4m3(x):
    """Round (already clamped) fp32 values to the nearest e4m3 value, ties to even.

    The later ``.to(float8e4nv)`` is then exact everywhere: the hardware conversion rounds
    the same way, and Triton's CPU interpreter (which mis-rounds mantissa carries and ties)
    gets representable values only. The exponent comes from the bits (exact); the rounding
    uses the fp32 magic-number trick on ``x / ulp`` (|x / ulp| < 16). Scales and reciprocals use
    ``div_rn`` (IEEE division) so the result matches the torch reference bit for bit.
    """
    bits = tl.abs(x).to(tl.int32, bitcast=True)
    exp = tl.maximum(((bits >> 23) & 255) - 127, -6)  # e4m3: 3 mantissa bits, min exponent -6
    ulp = ((exp - 3 + 127) << 23).to(tl.float32, bitcast=True)
    inv_ulp = ((127 - exp + 3) << 23).to(tl.float32, bitcast=True)  # exact powers of two
    return ((x * inv_ulp + 12582912.0) - 12582912.0) * ulp


@triton.jit
def _mla_pack_kernel(
    kv_c_ptr, k_pe_ptr, out_ptr, slot_ptr, scale_ptr, scale_out_ptr,
    num_tokens, page_size,
    stride_ct, stride_pt,
    stride_out_page, stride_out_slot,
    stride_sc_page, stride_sc_slot,
    DC: tl.constexpr, DR: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr,
    QUANT: tl.constexpr, USE_SLOTS: tl.constexpr, BLOCK_T: tl.constexpr,
):  # fmt: skip
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = tok < num_tokens
    tok64 = tok.to(tl.int64)
    dc = tl.arange(0, BLOCK_C)
    dr = tl.arange(0, BLOCK_R)
    if USE_SLOTS:
        slot = tl.load(slot_ptr + tok, mask=ok, other=-1).to(tl.int64)
        ok = ok & (slot >= 0)
        page = slot // page_size
        within = slot % page_size
    else:
        page = tok64
        within = tok64 * 0
    dest = page * stride_out_page + within * stride_out_slot
    c = tl.load(kv_c_ptr + tok64[:, None] * stride_ct + dc[None, :],
                mask=ok[:, None] & (dc[None, :] < DC), other=0.0).to(tl.float32)  # fmt: skip
    r = tl.load(k_pe_ptr + tok64[:, None] * stride_pt + dr[None, :],
                mask=ok[:, None] & (dr[None, :] < DR), other=0.0).to(tl.float32)  # fmt: skip
    if QUANT != 0:
        ones = tl.full([BLOCK_T], 1.0, tl.float32)
        if QUANT == 1:
            inv = tl.math.div_rn(ones, ones * tl.load(scale_ptr).to(tl.float32))
        else:
            amax = tl.maximum(tl.max(tl.abs(c), axis=1), tl.max(tl.abs(r), axis=1))
            row_scale = tl.maximum(tl.math.div_rn(amax, ones * 448.0), 1e-12)
            inv = tl.math.div_rn(ones, row_scale)
            tl.store(scale_out_ptr + page * stride_sc_page + within * stride_sc_slot, row_scale,
                     mask=ok)  # fmt: skip
        c = tl.minimum(tl.maximum(c * inv[:, None], -448.0), 448.0)
        r = tl.minimum(tl.maximum(r * inv[:, None], -448.0), 448.0)
        c = _round_e4m3(c)
        r = _round_e4m3(r)
    elem = out_ptr.dtype.element_ty
    tl.store(out_ptr + dest[:, None] + dc[None, :], c.to(elem),
             mask=ok[:, None] & (dc[None, :] < DC))  # fmt: skip
    tl.store(out_ptr + dest[:, None] + DC + dr[None, :], r.to(elem),
             mask=ok[:, None] & (dr[None, :] < DR))  # fmt: skip


def _launch(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    out: torch.Tensor,
    out_strides: tuple[int, int],
    *,
    slot_mapping: torch.Tensor | None,
    page_size: int,
    quant: int,
    scale: torch.Tensor | None,
    scale_out: torch.Tensor | None,
    scale_strides: tuple[int, int],
    config: Mapping[str, Any] | None,
) -> None:
    tokens = kv_c.shape[0]
    if tokens == 0:
        return
    if kv_c.stride(-1) != 1 or k_pe.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError("mla K/V pack needs unit stride along the last dim")
    cfg = dict(pack_default_config({}))
    cfg.update(config or {})
    block_t = int(cfg["block_t"])
    dc, dr = kv_c.shape[-1], k_pe.shape[-1]
    dummy = out
    _mla_pack_kernel[(triton.cdiv(tokens, block_t),)](
        kv_c, k_pe, out,
        slot_mapping if slot_mapping is not None else dummy,
        scale if scale is not None else dummy,
        scale_out if scale_out is not None else dummy,
        tokens, page_size,
        kv_c.stride(0), k_pe.stride(0),
        out_strides[0], out_strides[1],
        scale_strides[0], scale_strides[1],
        DC=dc, DR=dr, BLOCK_C=triton.next_power_of_2(dc), BLOCK_R=triton.next_power_of_2(dr),
        QUANT=quant, USE_SLOTS=slot_mapping is not None, BLOCK_T=block_t,
        num_warps=int(cfg["num_warps"]),
    )  # fmt: skip


def mla_kv_pack(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    config: Mapping[str, Any] | None = None,
) -> torch.Tensor:
    """Triton ``cat([kv_c, k_pe], -1)``; see ``tokenspeed.mla.mla_kv_pack``."""
    tokens, dim = kv_c.shape[0], kv_c.shape[-1] + k_pe.shape[-1]
    if out is None:
        out = torch.empty(tokens, dim, dtype=kv_c.dtype, device=kv_c.device)
    _launch(kv_c, k_pe, out, (out.stride(0), 0), slot_mapping=None, page_size=1,
            quant=QUANT_NONE, scale=None, scale_out=None, scale_strides=(0, 0),
            config=config)  # fmt: skip
    return out


def mla_kv_pack_quantize_fp8(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    *,
    scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    scale_out: torch.Tensor | None = None,
    config: Mapping[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton fused pack + FP8 quantize; see ``tokenspeed.mla.mla_kv_pack_quantize_fp8``."""
    tokens, dim = kv_c.shape[0], kv_c.shape[-1] + k_pe.shape[-1]
    if out is None:
        out = torch.empty(tokens, dim, dtype=torch.float8_e4m3fn, device=kv_c.device)
    if scale is None:
        if scale_out is None:
            scale_out = torch.empty(tokens, dtype=torch.float32, device=kv_c.device)
        quant, strides = QUANT_TOKEN, (scale_out.stride(0), 0)
    else:
        quant, strides = QUANT_TENSOR, (0, 0)
    _launch(kv_c, k_pe, out, (out.stride(0), 0), slot_mapping=None, page_size=1, quant=quant,
            scale=scale, scale_out=scale_out if scale is None else None, scale_strides=strides,
            config=config)  # fmt: skip
    return out, (scale_out if scale is None else scale)


def mla_store_kv(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    kv_scale: torch.Tensor | None = None,
    config: Mapping[str, Any] | None = None,
) -> None:
    """Triton fused pack (+ quantize) into the paged cache; see ``tokenspeed.mla.mla_store_kv``."""
    cache = kv_cache.reshape(kv_cache.shape[0], kv_cache.shape[1], kv_cache.shape[-1])
    page_size = cache.shape[1]
    quant, scale, scale_out, strides = QUANT_NONE, None, None, (0, 0)
    if cache.element_size() == 1:
        if kv_scale is None:
            raise ValueError("an FP8 cache needs kv_scale (per tensor [1] or per token [P, S])")
        if kv_scale.numel() == 1:
            quant, scale = QUANT_TENSOR, kv_scale
        else:
            scale_out = kv_scale.reshape(cache.shape[0], page_size)
            quant, strides = QUANT_TOKEN, (scale_out.stride(0), scale_out.stride(1))
    _launch(kv_c, k_pe, cache, (cache.stride(0), cache.stride(1)), slot_mapping=slot_mapping,
            page_size=page_size, quant=quant, scale=scale, scale_out=scale_out,
            scale_strides=strides, config=config)  # fmt: skip
