"""Paged extend (prefill) attention for CPU float32 through torch's fused SDPA, per request.

The reference (``reference/attention.py``) materialises every request's ``[Hq, M, N]`` score
matrix and makes five or six passes over it (matmul, scale, mask, softmax, ``nan_to_num``,
matmul); on a CPU those O(M*N) passes are most of a prefill step. This candidate keeps the
reference's loop over requests and its page gather, then hands each request to
``torch.nn.functional.scaled_dot_product_attention``, whose CPU kernel (flash attention)
never materialises the scores and reads K/V per KV head (``enable_gqa``, no repeated K/V).

Causality: SDPA's ``is_causal`` aligns the mask top-left, the op's mask is end-aligned
(query ``i`` of ``M`` sits at kv position ``N - M + i``). They agree when ``M == N`` (no cached
prefix), which is the common case; a request with a cached prefix gets an explicit
end-aligned boolean mask. Same contract as the reference, float32 only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["paged_extend_attention"]


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
    """Ragged ``q[T, Hq, D]`` over each request's cached K/V -> ``[T, Hq, Dv]`` (CPU float32)."""
    num_tokens, num_q_heads, _ = q.shape
    num_pages, page_size = k_cache.shape[:2]
    out = q.new_empty(num_tokens, num_q_heads, v_cache.shape[-1])
    bounds = cu_seqlens_q.tolist()
    for b, kv_len in enumerate(seq_lens.tolist()):
        start, end = bounds[b], bounds[b + 1]
        if end == start:
            continue
        pages = block_tables[b, : -(-kv_len // page_size)].long().clamp(0, num_pages - 1)
        # [1, Hk, N, D] views of the gathered pages (token-major; SDPA takes the strides).
        k = k_cache.index_select(0, pages).flatten(0, 1)[:kv_len].transpose(0, 1)[None]
        v = v_cache.index_select(0, pages).flatten(0, 1)[:kv_len].transpose(0, 1)[None]
        qb = q[start:end].transpose(0, 1)[None]  # [1, Hq, M, D]
        q_len = end - start
        mask = None
        if causal and q_len != kv_len:  # a cached prefix: end-aligned causal mask
            q_pos = torch.arange(kv_len - q_len, kv_len, device=q.device)
            mask = torch.arange(kv_len, device=q.device)[None, :] <= q_pos[:, None]
        ob = F.scaled_dot_product_attention(
            qb,
            k,
            v,
            attn_mask=mask,
            is_causal=causal and mask is None,
            scale=scale,
            enable_gqa=k.shape[1] != num_q_heads,
        )
        out[start:end] = ob[0].transpose(0, 1)
    return out
