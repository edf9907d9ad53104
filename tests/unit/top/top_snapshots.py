"""A hand-written `/v1/stats` document (schema version 1) for the dashboard's unit tests."""

from __future__ import annotations

import copy
from typing import Any

_BASE: dict[str, Any] = {
    "version": 1,
    "seq": 7,
    "time": 1_800_000_000.0,
    "server": {
        "model": "tiny-test",
        "version": "9.9.9",
        "started": 1_799_996_000.0,
        "uptime_s": 3723.4,
        "layout": {
            "world_size": 8,
            "tp": 4,
            "dp": 2,
            "attn_tp": 4,
            "dense_tp": 4,
            "moe_tp": 1,
            "ep": True,
            "text": "TP4 DP2 EP",
        },  # fmt: skip
        "kv_capacity": {
            "page_size": 16,
            "device_pages": 200,
            "device_tokens": 3200,
            "host_pages": 50,
        },  # fmt: skip
        "device": "cuda:0",
        "dtype": "bfloat16",
        "max_model_len": 4096,
        "max_num_seqs": 64,
    },
    "engine": {"alive": True, "error": None, "num_steps": 1234},
    "scheduler": {
        "waiting": 2,
        "prefilling": 1,
        "decoding": 3,
        "retracted": 1,
        "running": 4,
        "preemptions": 5,
        "prefix_cache_queried_tokens": 1000,
        "prefix_cache_hit_tokens": 250,
        "prefix_cache_hit_rate": 0.25,
        "cache_ops_in_flight": 0,
    },  # fmt: skip
    "kv": {
        "page_size": 16,
        "device": {"total": 200, "free": 120, "active": 50, "cached": 30, "evictable": 30},
        "host": {"total": 50, "free": 40, "active": 0, "cached": 10, "evictable": 10},
    },
    "throughput": {
        "prompt_tokens_per_s": 1500.0,
        "generation_tokens_per_s": 250.5,
        "total_tokens_per_s": 1750.5,
        "window_s": 2.0,
        "prompt_tokens": 9000,
        "generation_tokens": 4000,
    },  # fmt: skip
    "latency": {"ttft_ms": 123.4, "itl_ms": 7.25, "window_s": 2.0},
    "requests": [
        {
            "id": "chatcmpl-aaa-0-0",
            "state": "Decoding",
            "prompt_tokens": 100,
            "cached_tokens": 64,
            "output_tokens": 10,
            "max_new_tokens": 50,
            "ttft_ms": 80.0,
            "tokens_per_s": 40.0,
            "preemptions": 0,
            "age_s": 3.0,
        },
        {
            "id": "cmpl-bbb-0-0",
            "state": "Prefilling",
            "prompt_tokens": 900,
            "cached_tokens": 0,
            "output_tokens": 0,
            "max_new_tokens": 100,
            "ttft_ms": None,
            "tokens_per_s": None,
            "preemptions": 1,
            "age_s": 5.0,
        },
        {
            "id": "cmpl-ccc-0-1",
            "state": "Decoding",
            "prompt_tokens": 20,
            "cached_tokens": 16,
            "output_tokens": 30,
            "max_new_tokens": 30,
            "ttft_ms": 20.0,
            "tokens_per_s": 55.5,
            "preemptions": 2,
            "age_s": 1.0,
        },
    ],  # fmt: skip
    "num_requests": 3,
    "kernels": [
        {
            "op": "attention.decode",
            "kernel": "triton_decode",
            "buckets": 3,
            "reason": "tuned",
            "device": "cuda",
        },
        {
            "op": "norm.rms",
            "kernel": "torch_rms_norm",
            "buckets": 1,
            "reason": "only feasible kernel",
            "device": "cuda",
        },
    ],  # fmt: skip
}


def snapshot(**changes: Any) -> dict[str, Any]:
    """A deep copy of the sample document with top-level keys replaced."""
    out = copy.deepcopy(_BASE)
    out.update(changes)
    return out
