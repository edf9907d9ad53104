"""Writing new K/V into the paged cache."""

from __future__ import annotations

import torch


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """``cache[slot // S, slot % S] = new`` for every token; negative slots are skipped."""
    pages, page_size = k_cache.shape[:2]
    flat_k = k_cache.view(pages * page_size, *k_cache.shape[2:])
    flat_v = v_cache.view(pages * page_size, *v_cache.shape[2:])
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    flat_k.index_copy_(0, slots, k[keep].to(k_cache.dtype))  # index_copy_: the fast row copy
    flat_v.index_copy_(0, slots, v[keep].to(v_cache.dtype))
