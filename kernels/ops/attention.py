"""``paged_decode_attention`` and ``paged_extend_attention``."""

from __future__ import annotations

import torch

from ..selection import dispatch
from ..traits import bucket
from ._common import fmt


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    max_seq_len: int | None = None,
) -> torch.Tensor:
    """One query token per request over its paged K/V: ``q[B,Hq,D] -> [B,Hq,Dv]`` (GQA).

    ``max_seq_len`` is an optional host-side bound on ``seq_lens`` (the scheduler knows it);
    without it the bound is the block-table width times the page size. It only steers
    the split-KV heuristic, never correctness.
    """
    page_size = k_cache.shape[1]
    capacity = block_tables.shape[1] * page_size
    kv_len = min(max_seq_len, capacity) if max_seq_len else capacity
    sel = dispatch(
        "attention",
        "decode",
        q.device,
        {"q": fmt(q), "kv_cache": fmt(k_cache)},
        {
            "head_dim": q.shape[-1],
            "v_head_dim": v_cache.shape[-1],
            "num_kv_heads": k_cache.shape[2],
            "group_size": q.shape[1] // k_cache.shape[2],
            "page_size": page_size,
            "batch": bucket(q.shape[0]),
            "kv_len": bucket(kv_len),
            # (request, KV head) groups: how many SMs one program per group would fill
            "kv_groups": bucket(q.shape[0] * k_cache.shape[2]),
        },
    )
    return sel.run(q, k_cache, v_cache, block_tables, seq_lens, scale)


def extend_prefix_trait(
    num_tokens: int, batch: int, capacity: int, max_seq_len: int | None = None
) -> str:
    """``"none"`` when shapes alone prove a dense batch without cached prefixes, else ``"any"``.

    Every request has ``q_len_b <= seq_len_b <= L`` where ``L`` is the block-table capacity
    (or the tighter host bound ``max_seq_len``), and ``sum_b q_len_b == T``. So ``T == B * L``
    forces ``q_len_b == seq_len_b == L`` for every request: equal lengths, no prefix. No
    tensor value is read.
    """
    bound = min(max_seq_len, capacity) if max_seq_len else capacity
    return "none" if batch > 0 and bound > 0 and num_tokens == batch * bound else "any"


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
    max_seq_len: int | None = None,
) -> torch.Tensor:
    """Ragged new tokens ``q[T,Hq,D]`` over their requests' cached prefix plus themselves.

    The new K/V are already in the cache; request ``b``'s queries sit at kv positions
    ``seq_lens[b] - q_len_b .. seq_lens[b] - 1``. ``max_seq_len`` is an optional host-side
    bound on ``seq_lens``; it only feeds the ``prefix`` trait (never correctness).
    """
    batch = cu_seqlens_q.shape[0] - 1
    sel = dispatch(
        "attention",
        "extend",
        q.device,
        {"q": fmt(q), "kv_cache": fmt(k_cache)},
        {
            "head_dim": q.shape[-1],
            "v_head_dim": v_cache.shape[-1],
            "num_kv_heads": k_cache.shape[2],
            "group_size": q.shape[1] // k_cache.shape[2],
            "page_size": k_cache.shape[1],
            "causal": bool(causal),
            "num_tokens": bucket(q.shape[0]),
            "batch": bucket(batch),
            "prefix": extend_prefix_trait(
                q.shape[0], batch, block_tables.shape[1] * k_cache.shape[1], max_seq_len
            ),
        },
    )
    return sel.run(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, causal)
