"""Paged extend attention through ``torch.nn.functional.scaled_dot_product_attention``.

Feasible only when the op's shape traits prove the ragged batch is dense: ``B`` requests of
the same length ``L = T / B``, none with a cached prefix (``prefix == "none"``, decided in
``ops/attention.py`` from shapes and the optional host bound ``max_seq_len``; never from
tensor values). Then:

1. one gather per cache (a single advanced-indexing kernel through the block table, no host
   sync) builds K/V as ``[B, L, H, D]``; with ``gqa="expand"`` the gather also repeats each
   KV head for its query heads (what every SDPA backend accepts), with ``gqa="native"`` it
   keeps ``Hk`` heads and passes ``enable_gqa=True``;
2. SDPA runs on ``[B, H, L, D]`` views of those (BSHD strides, no further copies), with
   ``is_causal`` — without a prefix the top-left causal alignment SDPA uses is the same as
   the end-aligned one the op defines.

The gather costs one read and one write of the request's K/V (tens of microseconds at 16k
tokens), small next to the quadratic attention it feeds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F


def _gather(
    cache: torch.Tensor, tables: torch.Tensor, heads: torch.Tensor, length: int
) -> torch.Tensor:
    """``[B, length, len(heads), D]`` rows of ``cache[P, S, Hk, D]`` through ``tables[B, pages]``."""
    page_size = cache.shape[1]
    slots = torch.arange(page_size, device=cache.device)
    rows = cache[tables[:, :, None, None], slots[None, None, :, None], heads[None, None, None, :]]
    batch, pages = tables.shape
    return rows.view(batch, pages * page_size, heads.numel(), cache.shape[-1])[:, :length]


def paged_extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    causal: bool = True,
    *,
    config: Mapping[str, Any] | None = None,
) -> torch.Tensor:
    """Dense-batch paged extend via SDPA; see ``tokenspeed.kernels.paged_extend_attention``.

    Precondition (the registry's ``prefix == "none"`` trait): every request has
    ``q_len == seq_len == T / B``. ``seq_lens`` is not read (that would sync).
    """
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    v_head_dim = v_cache.shape[-1]
    batch = cu_seqlens_q.numel() - 1
    if num_tokens == 0 or batch <= 0:
        return q.new_empty((num_tokens, num_q_heads, v_head_dim))
    if num_tokens % batch:
        raise ValueError("sdpa extend needs B requests of equal length (T divisible by B)")
    length = num_tokens // batch
    page_size = k_cache.shape[1]
    pages = -(-length // page_size)
    if pages > block_tables.shape[1]:
        raise ValueError("block tables are narrower than the requests' length")
    tables = block_tables[:batch, :pages].to(torch.int64)
    group = num_q_heads // num_kv_heads
    native = (config or {}).get("gqa", "expand") == "native" and group > 1
    if native:
        heads = torch.arange(num_kv_heads, device=q.device)
    else:
        heads = torch.arange(num_q_heads, device=q.device) // group
    k = _gather(k_cache, tables, heads, length).transpose(1, 2)
    v = _gather(v_cache, tables, heads, length).transpose(1, 2)
    qb = q.view(batch, length, num_q_heads, head_dim).transpose(1, 2)
    extra = {"enable_gqa": True} if native else {}
    out = F.scaled_dot_product_attention(qb, k, v, is_causal=bool(causal), scale=scale, **extra)
    return out.transpose(1, 2).reshape(num_tokens, num_q_heads, v_head_dim)
