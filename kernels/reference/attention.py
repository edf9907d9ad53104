"""Paged attention over the K/V cache (GQA), decode and ragged extend.

K/V live in pages ``cache[P, S, Hk, D]``; a request's block-table row lists its pages in
order, so kv position ``n`` of request ``b`` is slot ``block_tables[b, n // S] * S + n % S``.
Entries of a block-table row past the request's length may hold anything (they are clamped
and masked, never trusted).
"""

from __future__ import annotations

import torch


def _gather_pages(cache: torch.Tensor, pages: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` tokens addressed by block-table rows ``pages[..., max_pages]``."""
    num_pages, page_size = cache.shape[:2]
    pos = torch.arange(length, device=cache.device)
    page_ids = pages.long()[..., pos // page_size].clamp(0, num_pages - 1)
    slots = page_ids * page_size + pos % page_size
    return cache.view(num_pages * page_size, *cache.shape[2:])[slots]


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Masked GQA softmax attention in float32.

    ``q[..., Hq, M, D]``, ``k[..., Hk, N, D]``, ``v[..., Hk, N, Dv]``, ``mask[..., 1, M, N]``
    (True = attend). Rows with nothing to attend produce zeros.
    """
    hq, hk = q.shape[-3], k.shape[-3]
    k = k.float().repeat_interleave(hq // hk, dim=-3)
    v = v.float().repeat_interleave(hq // hk, dim=-3)
    scores = torch.matmul(q.float(), k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.matmul(probs, v)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per request attending to its first ``seq_lens[b]`` cached tokens."""
    length = block_tables.shape[1] * k_cache.shape[1]
    k = _gather_pages(k_cache, block_tables, length).transpose(1, 2)  # [B, Hk, L, D]
    v = _gather_pages(v_cache, block_tables, length).transpose(1, 2)
    pos = torch.arange(length, device=q.device)
    mask = (pos[None, :] < seq_lens.long()[:, None])[:, None, None, :]  # [B, 1, 1, L]
    out = _attend(q.unsqueeze(2), k, v, mask, scale)  # [B, Hq, 1, Dv]
    return out.squeeze(2).to(q.dtype)


def paged_extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    causal: bool = True,
) -> torch.Tensor:
    """Ragged queries over their requests' cached K/V (prefix plus the new tokens).

    Request ``b`` owns queries ``cu_seqlens_q[b]:cu_seqlens_q[b+1]``, sitting at kv
    positions ``seq_lens[b] - q_len .. seq_lens[b] - 1``. Loops over requests (reference).
    """
    out = q.new_empty(q.shape[0], q.shape[1], v_cache.shape[-1])
    bounds = cu_seqlens_q.tolist()
    lengths = seq_lens.tolist()
    for b, kv_len in enumerate(lengths):
        start, end = bounds[b], bounds[b + 1]
        if end == start:
            continue
        k = _gather_pages(k_cache, block_tables[b], kv_len).transpose(0, 1)  # [Hk, N, D]
        v = _gather_pages(v_cache, block_tables[b], kv_len).transpose(0, 1)
        q_pos = torch.arange(kv_len - (end - start), kv_len, device=q.device)
        kv_pos = torch.arange(kv_len, device=q.device)
        if causal:
            mask = kv_pos[None, :] <= q_pos[:, None]
        else:
            mask = torch.ones(end - start, kv_len, dtype=torch.bool, device=q.device)
        qb = q[start:end].transpose(0, 1)  # [Hq, M, D]
        out[start:end] = _attend(qb, k, v, mask[None], scale).transpose(0, 1).to(q.dtype)
    return out
