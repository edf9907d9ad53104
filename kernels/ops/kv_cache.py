"""``store_kv``."""

from __future__ import annotations

import torch

from ..selection import dispatch
from ..traits import bucket
from ._common import fmt


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``k[T,Hk,D]``/``v[T,Hk,Dv]`` into the paged caches at ``slot_mapping[T]``.

    Slot ``s`` is page ``s // S``, offset ``s % S``; negative slots (padding) are skipped.
    """
    sel = dispatch(
        "kv_cache",
        "store",
        k.device,
        {"k": fmt(k), "kv_cache": fmt(k_cache)},
        {"head_dim": k.shape[-1], "page_size": k_cache.shape[1], "num_tokens": bucket(k.shape[0])},
    )
    sel.run(k, v, k_cache, v_cache, slot_mapping)
