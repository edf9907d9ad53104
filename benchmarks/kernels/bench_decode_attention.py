"""Paged GQA decode attention, Llama-3-8B shapes (32 q heads, 8 KV heads, head dim 128, bf16).

Reported against the device-copy bandwidth: the kernel must stream every request's K and V
once, so bytes = 2 * batch * kv_len * kv_heads * head_dim * 2.

    python benchmarks/kernels/bench_decode_attention.py --out decode.json
"""

from __future__ import annotations

import sys

import torch
from common import run_benchmark, time_op

from tokenspeed.kernels import paged_decode_attention
from tokenspeed.kernels.workloads import Inputs, make_inputs

HEADS = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128}
# Extra launch configs (Triton kernel called directly) next to the default, so one run shows
# what each switch of the default is worth: the previous default (about 4 programs per SM,
# merge launch), the default with pointer loads instead of TMA, and with the merge launch
# instead of the fused merge. A variant that would equal the default is skipped.


def _traits(shape):
    return {"batch": shape["batch"], "num_kv_heads": shape["num_kv_heads"],
            "kv_len": shape["kv_len"], "head_dim": shape["head_dim"],
            "page_size": shape["page_size"]}  # fmt: skip


def _without(key):
    def variant(shape):
        from tokenspeed.kernels.triton_ops.configs import decode_default_config

        default = decode_default_config(_traits(shape))
        return {k: v for k, v in default.items() if k != key} if key in default else None

    return variant


def _previous_default(shape):
    from tokenspeed.kernels.triton_ops.configs import decode_num_splits

    return {"block_n": 64, "num_warps": 4, "num_stages": 2,
            "num_splits": decode_num_splits(_traits(shape))}  # fmt: skip


VARIANTS = {
    "previous-default": _previous_default,
    "pointer-loads": _without("tma"),
    "merge-kernel": _without("merge"),
}


def cases(args):
    shapes = [(64, 2048), (16, 8192)]
    pages = [16] if args.quick else [16, 64]
    for batch, kv_len in shapes:
        for page_size in pages:
            shape = {"batch": batch, "kv_len": kv_len, **HEADS, "page_size": page_size}
            yield from _case(args, shape, "default", None)
            for label, variant in VARIANTS.items():
                config = variant(shape)
                if config is not None:
                    yield from _case(args, shape, label, config)


def _case(args, shape, label, config):
    batch, kv_len, page_size = shape["batch"], shape["kv_len"], shape["page_size"]

    def run(bounds, shape=shape, config=config, label=label):
        from tokenspeed.kernels.triton_ops import decode_attention

        def call(inp: Inputs):
            if config is not None:
                return decode_attention.paged_decode_attention(*inp.args, config=config)
            return paged_decode_attention(*inp.args, max_seq_len=shape["kv_len"])

        def make(i, shape=shape):
            return make_inputs("attention.decode", shape, torch.bfloat16, "cuda", seed=i)

        timing, sets = time_op(call, make, _kv_bytes(shape), args.replays)
        kv_bytes = _kv_bytes(shape)(None)
        gbps = kv_bytes / (timing.median_us * 1e-6) / 1e9
        return {
            **shape,
            "variant": label,
            "config": config,
            "median_us": timing.median_us,
            "p10_us": timing.p10_us,
            "p90_us": timing.p90_us,
            "timing": timing.method,
            "input_sets": sets,
            "kv_bytes": kv_bytes,
            "gbps": gbps,
            "fraction_of_copy_bw": gbps / bounds["copy_gbps"],
        }

    suffix = "" if config is None else f" [{label}]"
    yield f"decode b={batch} kv={kv_len} page={page_size}{suffix}", run


def _kv_bytes(shape):
    total = 2 * shape["batch"] * shape["kv_len"] * shape["num_kv_heads"] * shape["head_dim"] * 2
    return lambda _inputs: total


if __name__ == "__main__":
    sys.exit(run_benchmark("paged_decode_attention", __doc__, cases))
