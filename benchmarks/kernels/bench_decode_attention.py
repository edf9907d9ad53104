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


def cases(args):
    shapes = [(64, 2048), (16, 8192)]
    pages = [16] if args.quick else [16, 64]
    for batch, kv_len in shapes:
        for page_size in pages:
            shape = {"batch": batch, "kv_len": kv_len, **HEADS, "page_size": page_size}

            def run(bounds, shape=shape):
                def call(inp: Inputs):
                    return paged_decode_attention(*inp.args, max_seq_len=shape["kv_len"])

                def make(i, shape=shape):
                    return make_inputs("attention.decode", shape, torch.bfloat16, "cuda", seed=i)

                timing, sets = time_op(call, make, _kv_bytes(shape), args.replays)
                kv_bytes = _kv_bytes(shape)(None)
                gbps = kv_bytes / (timing.median_us * 1e-6) / 1e9
                return {
                    **shape,
                    "median_us": timing.median_us,
                    "p10_us": timing.p10_us,
                    "p90_us": timing.p90_us,
                    "timing": timing.method,
                    "input_sets": sets,
                    "kv_bytes": kv_bytes,
                    "gbps": gbps,
                    "fraction_of_copy_bw": gbps / bounds["copy_gbps"],
                }

            yield f"decode b={batch} kv={kv_len} page={page_size}", run


def _kv_bytes(shape):
    total = 2 * shape["batch"] * shape["kv_len"] * shape["num_kv_heads"] * shape["head_dim"] * 2
    return lambda _inputs: total


if __name__ == "__main__":
    sys.exit(run_benchmark("paged_decode_attention", __doc__, cases))
