"""Launch plans of the CuTe DSL kernels, from shapes only (importable without CuTe DSL, so the
registry can describe and tune them anywhere)."""

from __future__ import annotations

from typing import Any

Config = dict[str, Any]


def _sm_count() -> int:
    import torch

    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


SM90_SMEM_BYTES = 227 * 1024  # shared memory one CTA may use on Hopper


def gqa_decode_smem_bytes(head_dim: int, stages: int, rows: int = 16) -> int:
    """Shared memory of one GQA decode CTA: ``stages`` 64-token K and V tiles, the query block,
    ``p^T``, and 4 KiB for barriers, row statistics and each buffer's 1 KiB alignment (an
    upper bound), so a plan that does not fit is refused before it is compiled."""
    return stages * 2 * 64 * head_dim * 2 + rows * head_dim * 2 + 64 * rows * 2 + 4 * 1024


def gqa_decode_default_config(traits: dict[str, Any], sms: int | None = None) -> Config:
    """The H200 sweep's best plan by page size (2026-12-02, 16 x 8k tokens, Llama-3-8B heads).

    - pages under 64 tokens: a cluster of two CTAs per (request, KV head) when the groups alone
      do not outnumber the SMs, two stages. A tile of small pages takes one TMA box per page,
      which caps one CTA near 25 GB/s (78 % of copy with one CTA per group, 97 % with two);
    - pages of 64+ tokens: one CTA per group, three stages (97-101 % of copy).
    """
    sms = _sm_count() if sms is None else sms
    groups = traits["batch"] * traits["num_kv_heads"]
    if traits["page_size"] < 64:
        return {"cluster": 2 if groups <= sms else 1, "stages": 2, "evict_first": True}
    return {"cluster": 1, "stages": 3, "evict_first": True}


def gqa_decode_config_space(traits: dict[str, Any], sms: int | None = None) -> list[Config]:
    """Cluster of one or two, two to six stages (one to three CTAs per SM), L2 hint on/off.
    (Clusters of three and four run and pass the GPU tests but measured slower: 74-90 %.)"""
    space = [gqa_decode_default_config(traits, sms)]
    for cluster in (1, 2):
        for stages in (2, 3, 4, 6):
            for evict_first in (True, False):
                cfg = {"cluster": cluster, "stages": stages, "evict_first": evict_first}
                if cfg not in space:
                    space.append(cfg)
    return space
