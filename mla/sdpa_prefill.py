"""MLA prefill through ``torch.nn.functional.scaled_dot_product_attention`` (cuDNN first).

This is a vendor kernel (cuDNN's fused attention on NVIDIA GPUs), not TokenSpeed's: the
registry offers it as a PERFORMANT candidate next to the Triton kernel for the one case it
computes exactly, which the shape traits of ``tokenspeed.mla.mla_prefill`` prove without
reading a tensor (see ``catalog.py``):

* one request (``batch == 1``) with no cached prefix (``Tq == Tk``): then SDPA's top-left
  causal mask (``is_causal``) is the op's end-aligned one, and the ragged batch is a dense
  ``[1, H, T, D]`` problem. With several requests (or a prefix) the Triton kernel runs.
* no LSE: cuDNN computes it but the public SDPA call does not return it.
* bf16/fp16, head dims that cuDNN/flash accept (multiples of 8 up to 256).

Q/K/V are passed as ``[1, H, T, D]`` views of the ``[T, H, D]`` inputs (BHSD shape, BSHD
strides: no copies). GQA (``Hk < H``) repeats K/V heads by default (``gqa="expand"``: every
backend accepts it; MLA prefill decompresses K/V per head, so ``Hk == H`` in practice), or
passes ``enable_gqa=True`` (``gqa="native"``), which not every backend supports.

On CUDA the backends are tried in the order cuDNN, flash, memory-efficient (``set_priority``);
the math backend is excluded (it would materialise the ``T x T`` scores of every head). If
none can run these inputs, the call falls back to the Triton kernel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F


def _bhsd(x: torch.Tensor) -> torch.Tensor:
    """``[T, H, D]`` as a ``[1, H, T, D]`` view (no copy)."""
    return x.transpose(0, 1).unsqueeze(0)


def _sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, native_gqa: bool
) -> torch.Tensor:
    """SDPA with cuDNN first on CUDA (no math fallback); the default choice on CPU."""
    extra = {"enable_gqa": True} if native_gqa else {}
    if not q.is_cuda:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, **extra)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
             SDPBackend.EFFICIENT_ATTENTION]  # fmt: skip
    with sdpa_kernel(order, set_priority=True):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, **extra)


def _no_backend(err: RuntimeError) -> bool:
    """SDPA's "no backend can run these inputs" error (its wording differs across versions)."""
    text = str(err).lower()
    return "no available kernel" in text or "no viable backend" in text


def mla_prefill(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_kv: torch.Tensor,
    *,
    softmax_scale: float,
    causal: bool = True,
    return_lse: bool = False,
    max_seqlen_q: int | None = None,
    max_seqlen_kv: int | None = None,
    out: torch.Tensor | None = None,
    config: Mapping[str, Any] | None = None,
) -> torch.Tensor:
    """One request without prefix through SDPA; see ``tokenspeed.mla.mla_prefill``.

    Preconditions (the registry's traits, from shapes): ``cu_seqlens_q`` has two entries,
    ``Tq == Tk``, ``return_lse`` is False. ``cu_seqlens_*`` are never read (that would sync).
    """
    if return_lse:
        raise ValueError("the SDPA prefill candidate cannot return the LSE")
    tq, heads, _ = query.shape
    if cu_seqlens_q.numel() != 2 or key.shape[0] != tq:
        raise ValueError("the SDPA prefill candidate needs one request without prefix")
    if tq == 0:
        return out if out is not None else query.new_empty(0, heads, value.shape[-1])
    group = heads // key.shape[1]
    native = group > 1 and (config or {}).get("gqa", "expand") == "native"
    k, v = key, value
    if group > 1 and not native:
        k, v = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    try:
        res = _sdpa(_bhsd(query), _bhsd(k), _bhsd(v), bool(causal), softmax_scale, native)
    except RuntimeError as err:
        if not query.is_cuda or not _no_backend(err):
            raise
        from .triton_prefill import mla_prefill as triton_mla_prefill

        # SDPA found no backend for these inputs (e.g. an older cuDNN): run our kernel.
        return triton_mla_prefill(
            query, key, value, cu_seqlens_q, cu_seqlens_kv, softmax_scale=softmax_scale,
            causal=causal, max_seqlen_q=max_seqlen_q, out=out,
        )  # fmt: skip
    res = res[0].transpose(0, 1)  # [T, H, Dv] view
    if out is None:
        return res.contiguous()
    out.copy_(res)
    return out
