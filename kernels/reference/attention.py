"""Paged attention over the K/V cache (GQA), decode and ragged extend.

K/V live in pages ``cache[P, S, Hk, D]``; a request's block-table row lists its pages in
order, so kv position ``n`` of request ``b`` is ``cache[block_tables[b, n // S], n % S]``.
Entries of a block-table row past the request's length may hold anything (they are clamped
and masked, never trusted).

GQA without repeating K/V: query head ``h`` reads KV head ``h // G`` (``G = Hq // Hk``), so the
queries are viewed as ``[Hk, G, ...]`` and every KV head is multiplied once against its
``G`` query heads (one batched matmul), instead of repeating K/V ``G`` times.
"""

from __future__ import annotations

import torch


def _gather_pages(cache: torch.Tensor, pages: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` tokens of block-table rows ``pages[..., n]``, as ``[..., Hk, length, D]``.

    Whole pages are copied (one index per page, not per token), then laid out head-major so
    that each KV head is a contiguous ``[length, D]`` matrix.
    """
    num_pages, page_size = cache.shape[:2]
    pages = pages.long().clamp(0, num_pages - 1)
    tokens = cache.index_select(0, pages.flatten())  # [..., n pages, S, Hk, D], flattened
    tokens = tokens.view(*pages.shape[:-1], pages.shape[-1] * page_size, *cache.shape[2:])
    return tokens[..., :length, :, :].transpose(-3, -2).contiguous().float()


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Masked GQA softmax attention in float32.

    ``q[..., Hk, G, M, D]`` (the ``G`` query heads of each KV head), ``k[..., Hk, N, D]``,
    ``v[..., Hk, N, Dv]``, ``mask`` broadcastable to ``[..., Hk, G, M, N]`` (True = attend).
    Returns ``[..., Hk, G, M, Dv]``; rows with nothing to attend produce zeros.
    """
    group, m = q.shape[-3], q.shape[-2]
    grouped = q.float().flatten(-3, -2)  # [..., Hk, G*M, D]: one matmul per KV head
    scores = torch.matmul(grouped, k.transpose(-1, -2)) * scale
    scores = scores.unflatten(-2, (group, m)).masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.matmul(probs.flatten(-3, -2), v).unflatten(-2, (group, m))


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per request attending to its first ``seq_lens[b]`` cached tokens.

    The whole batch at once: every request reads the full block-table width ``L`` and
    positions ``>= seq_lens[b]`` are masked. K/V stay token-major as gathered
    (``[B, L, Hk, D]``): each KV head is a strided ``[B, L, D]`` batch that ``bmm`` reads in
    place, which saves the head-major copy (a loop over KV heads, not over tokens).
    """
    batch, hq, head_dim = q.shape
    num_pages, page_size, hk, _ = k_cache.shape
    group, v_dim = hq // hk, v_cache.shape[-1]
    length = block_tables.shape[1] * page_size
    pages = block_tables.long().clamp(0, num_pages - 1).flatten()
    k = k_cache.index_select(0, pages).view(batch, length, hk, head_dim).float()
    v = v_cache.index_select(0, pages).view(batch, length, hk, v_dim).float()
    pos = torch.arange(length, device=q.device)
    visible = pos[None, :] < seq_lens.long()[:, None]  # [B, L]
    bias = torch.zeros(visible.shape, device=q.device).masked_fill_(~visible, float("-inf"))
    qg = q.float().reshape(batch, hk, group, head_dim)
    out = torch.empty(batch, hk, group, v_dim, device=q.device)
    for h in range(hk):
        scores = torch.baddbmm(bias[:, None, :], qg[:, h], k[:, :, h].transpose(1, 2), alpha=scale)
        probs = torch.softmax(scores, dim=-1).nan_to_num_(0.0)  # empty requests -> zeros
        out[:, h] = torch.bmm(probs, v[:, :, h])
    return out.reshape(batch, hq, v_dim).to(q.dtype)


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
    num_tokens, hq, head_dim = q.shape
    page_size, hk, v_dim = k_cache.shape[1], k_cache.shape[2], v_cache.shape[-1]
    out = q.new_empty(num_tokens, hq, v_dim)
    bounds = cu_seqlens_q.tolist()
    lengths = seq_lens.tolist()
    for b, kv_len in enumerate(lengths):
        start, end = bounds[b], bounds[b + 1]
        if end == start:
            continue
        pages = block_tables[b, : -(-kv_len // page_size)]
        k = _gather_pages(k_cache, pages, kv_len)  # [Hk, N, D]
        v = _gather_pages(v_cache, pages, kv_len)
        q_pos = torch.arange(kv_len - (end - start), kv_len, device=q.device)
        kv_pos = torch.arange(kv_len, device=q.device)
        if causal:
            mask = kv_pos[None, :] <= q_pos[:, None]  # [M, N]
        else:
            mask = torch.ones(end - start, kv_len, dtype=torch.bool, device=q.device)
        qb = q[start:end].reshape(end - start, hk, hq // hk, head_dim).permute(1, 2, 0, 3)
        ob = _attend(qb, k, v, mask, scale)  # [Hk, G, M, Dv]
        out[start:end] = ob.permute(2, 0, 1, 3).reshape(end - start, hq, v_dim).to(q.dtype)
    return out
