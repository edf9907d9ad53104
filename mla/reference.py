"""Torch REFERENCE implementations of the MLA ops: they define what each op means.

Vectorised, float32 math; loop bounds come from shapes only, so they also run on a GPU for
the GPU tests (only ``mla_store_kv`` reads slot values, to skip padding, as the kernels'
``store_kv`` reference does). Layout conventions (shared with the Triton kernels):

* Latent cache ``kv_cache[P, S, D]`` with ``D = kv_lora_rank + rope_dim`` (512 + 64 = 576):
  the first ``kv_lora_rank`` values are the compressed KV (it is V, and the first part of K),
  the rest the rotated rope key. Page ``p`` offset ``s`` is slot ``p * S + s``.
* FP8 cache: ``float8_e4m3fn`` values ``x_q = clamp(x / scale, -448, 448)``; ``scale`` is either
  per tensor (``kv_scale`` with one element) or per token (``kv_scale[P, S]`` float32, one
  scale per cached vector, written by ``mla_store_kv``/``mla_kv_pack_quantize_fp8``).
* LSE outputs use the natural logarithm.
"""

from __future__ import annotations

import math

import torch

FP8_MAX = 448.0
_FP8_MIN_SCALE = 1e-12


def _dequant_rows(values: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """``values[..., D]`` (any dtype) to float32, times the per-tensor or per-row scale."""
    out = values.float()
    if scale is None:
        return out
    if scale.numel() == 1:
        return out * scale.reshape(()).float()
    return out * scale.float().unsqueeze(-1)


def mla_decode(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    softmax_scale: float,
    *,
    out: torch.Tensor | None = None,
    return_lse: bool = False,
    kv_scale: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    num_splits: int | None = None,
    fold_sq_factor: int | None = None,
    kv_lora_rank: int = 512,
    max_seq_len: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Absorbed-MLA decode over the paged latent cache; see ``tokenspeed.mla.mla_decode``.

    ``workspace``, ``num_splits``, ``fold_sq_factor`` and ``max_seq_len`` only steer kernels;
    the reference accepts and ignores them. Requests are processed in batch chunks so the
    gathered cache stays below ~256 MiB.
    """
    del workspace, num_splits, fold_sq_factor, max_seq_len
    batch, q_len, heads, dim = query.shape
    cache = kv_cache.reshape(kv_cache.shape[0], kv_cache.shape[1], -1)
    num_pages, page_size, _ = cache.shape
    length = block_tables.shape[1] * page_size
    flat = cache.reshape(num_pages * page_size, dim)
    flat_scale = None
    if kv_scale is not None:
        flat_scale = kv_scale if kv_scale.numel() == 1 else kv_scale.reshape(-1)
    pos = torch.arange(length, device=query.device)
    t = torch.arange(q_len, device=query.device)
    result = torch.empty(batch, q_len, heads, kv_lora_rank, dtype=query.dtype, device=query.device)
    lse = torch.empty(batch, q_len, heads, dtype=torch.float32, device=query.device)
    chunk = max(1, (256 << 20) // max(1, length * dim * 4 + q_len * heads * length * 8))
    for b0 in range(0, batch, chunk):
        rows = slice(b0, min(batch, b0 + chunk))
        pages = block_tables[rows].long()[:, pos // page_size].clamp(0, num_pages - 1)
        slots = pages * page_size + pos % page_size  # [b, L]
        kv = flat[slots]
        scale = None
        if flat_scale is not None:
            scale = flat_scale if flat_scale.numel() == 1 else flat_scale[slots]
        kv = _dequant_rows(kv, scale)  # [b, L, D]
        scores = torch.einsum("bqhd,bld->bqhl", query[rows].float(), kv) * softmax_scale
        q_pos = seq_lens[rows].long()[:, None] - q_len + t[None, :]  # [b, q]
        visible = (pos[None, None, :] <= q_pos[:, :, None]) & (
            pos[None, None, :] < seq_lens[rows].long()[:, None, None]
        )
        scores = scores.masked_fill(~visible[:, :, None, :], float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)  # -inf for rows with nothing visible
        probs = torch.exp(scores - row_lse.nan_to_num(0.0, neginf=0.0)[..., None])
        probs = probs.nan_to_num(0.0)
        result[rows] = torch.einsum("bqhl,bld->bqhd", probs, kv[..., :kv_lora_rank]).to(query.dtype)
        lse[rows] = row_lse
    if out is not None:
        out.copy_(result)
        result = out
    return (result, lse) if return_lse else result


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
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Ragged attention with q/k head dim != v head dim; see ``tokenspeed.mla.mla_prefill``.

    Dense over all tokens with a block-diagonal (and, if causal, end-aligned triangular)
    mask, processed in query chunks so the score matrix stays bounded.
    """
    del max_seqlen_q, max_seqlen_kv
    tq, heads, _ = query.shape
    tk, heads_kv, _ = key.shape
    dev = query.device
    cu_q, cu_k = cu_seqlens_q.long(), cu_seqlens_kv.long()
    q_idx, k_idx = torch.arange(tq, device=dev), torch.arange(tk, device=dev)
    seg_q = torch.searchsorted(cu_q[1:], q_idx, right=True)  # request of each query token
    seg_k = torch.searchsorted(cu_k[1:], k_idx, right=True)
    q_len = (cu_q[1:] - cu_q[:-1])[seg_q.clamp(max=cu_q.numel() - 2)]
    k_len = (cu_k[1:] - cu_k[:-1])[seg_q.clamp(max=cu_q.numel() - 2)]
    # Position of each query token in its request's KV sequence (end-aligned), and of each key.
    q_pos = q_idx - cu_q[seg_q.clamp(max=cu_q.numel() - 2)] + (k_len - q_len)
    k_pos = k_idx - cu_k[seg_k.clamp(max=cu_k.numel() - 2)]
    k = key.float().repeat_interleave(heads // heads_kv, dim=1).transpose(0, 1)  # [H, Tk, D]
    v = value.float().repeat_interleave(heads // heads_kv, dim=1).transpose(0, 1)
    if out is None:
        out = torch.empty(tq, heads, value.shape[-1], dtype=query.dtype, device=dev)
    lse = torch.empty(tq, heads, dtype=torch.float32, device=dev)
    chunk = max(1, (256 << 20) // max(1, heads * tk * 8))
    for r0 in range(0, tq, chunk):
        rows = slice(r0, min(tq, r0 + chunk))
        visible = seg_q[rows, None] == seg_k[None, :]
        if causal:
            visible &= k_pos[None, :] <= q_pos[rows, None]
        q = query[rows].float().transpose(0, 1)  # [H, r, D]
        scores = torch.matmul(q, k.transpose(1, 2)) * softmax_scale
        scores = scores.masked_fill(~visible[None], float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - row_lse.nan_to_num(0.0, neginf=0.0)[..., None]).nan_to_num(0.0)
        out[rows] = torch.matmul(probs, v).transpose(0, 1).to(query.dtype)
        lse[rows] = row_lse.transpose(0, 1)
    return (out, lse) if return_lse else out


def _quantize(
    rows: torch.Tensor, scale: torch.Tensor | None, fp8_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 rows and the scale used: per tensor when given, else per row (amax / 448)."""
    x = rows.float()
    if scale is None:
        row_scale = (x.abs().amax(dim=-1) / FP8_MAX).clamp_min(_FP8_MIN_SCALE)
        q = (x * (1.0 / row_scale)[:, None]).clamp(-FP8_MAX, FP8_MAX).to(fp8_dtype)
        return q, row_scale
    s = scale.reshape(()).float()
    q = (x * (1.0 / s)).clamp(-FP8_MAX, FP8_MAX).to(fp8_dtype)
    return q, scale


def mla_kv_pack(
    kv_c: torch.Tensor, k_pe: torch.Tensor, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``cat([kv_c, k_pe], -1)`` into the latent cache layout (``out`` may be given)."""
    packed = torch.cat((kv_c, k_pe), dim=-1)
    if out is None:
        return packed
    out.copy_(packed)
    return out


def mla_kv_pack_quantize_fp8(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    *,
    scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    scale_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cat`` then quantize to FP8 e4m3; per-tensor ``scale`` if given, else per token."""
    fp8 = out.dtype if out is not None else torch.float8_e4m3fn
    q, used = _quantize(torch.cat((kv_c, k_pe), dim=-1), scale, fp8)
    if out is not None:
        out.copy_(q)
        q = out
    if scale is None and scale_out is not None:
        scale_out.copy_(used)
        used = scale_out
    return q, used


def mla_store_kv(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    kv_scale: torch.Tensor | None = None,
) -> None:
    """Write packed latent vectors at ``slot_mapping`` (negative slots are skipped).

    FP8 caches quantize on the way: ``kv_scale`` with one element is a static per-tensor
    scale; ``kv_scale[P, S]`` receives a per-token scale at the same slot.
    """
    cache = kv_cache.reshape(-1, kv_cache.shape[-1])
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    rows = torch.cat((kv_c[keep], k_pe[keep]), dim=-1)
    if kv_cache.dtype in (torch.float32, torch.float16, torch.bfloat16):
        cache[slots] = rows.to(kv_cache.dtype)
        return
    if kv_scale is None:
        raise ValueError("an FP8 cache needs kv_scale (per tensor [1] or per token [P, S])")
    per_tensor = kv_scale.numel() == 1
    values, used = _quantize(rows, kv_scale if per_tensor else None, kv_cache.dtype)
    cache.view(torch.uint8)[slots] = values.view(torch.uint8)
    if not per_tensor:
        kv_scale.view(-1)[slots] = used


def softmax_scale_for(qk_head_dim: int, mscale: float = 1.0) -> float:
    """``mscale^2 / sqrt(qk_head_dim)``: DeepSeek's softmax scale (yarn mscale applied)."""
    return mscale * mscale / math.sqrt(qk_head_dim)
