"""Fused MoE experts, Qwen3-30B-A3B shapes (128 experts, top-8, hidden 2048, expert
intermediate 768, bf16), 1 to 256 tokens.

Memory-bound at few tokens: the bound is reading the weights of every expert that at
least one token routes to (3 * I * H * 2 bytes each) plus the activations. Reported as the
fraction of copy bandwidth, and as TFLOP/s (2 * 3 * T * k * H * I FLOPs).

    python benchmarks/kernels/bench_fused_moe.py --out moe.json
"""

from __future__ import annotations

import sys

import torch
from common import run_benchmark, time_op

from tokenspeed.kernels import fused_moe
from tokenspeed.kernels.workloads import make_inputs

MODEL = {"hidden": 2048, "intermediate": 768, "num_experts": 128, "top_k": 8}
# Extra configs (the Triton kernel called directly) next to the default, so one run shows
# what the default gains: the previous default (sorted path, torch alignment and top-k sum)
# and, up to 16 tokens where the default is sort-free, the sorted path with the one-launch
# Triton alignment and top-k sum.
PREVIOUS_SMALL = {"block_m": 16, "block_n": 32, "block_k": 128, "num_warps": 4, "num_stages": 4,
                  "down_block_n": 64, "down_block_k": 128}  # fmt: skip
PREVIOUS = {"block_m": 16, "block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 3}


def _variants(tokens):
    previous = PREVIOUS_SMALL if tokens * MODEL["top_k"] <= 64 else PREVIOUS
    variants = {"default": None, "previous-default": previous}
    if tokens <= 16:
        variants["sorted-fewer-launches"] = {**previous, "align": "triton", "reduce": "triton"}
    return variants


def cases(args):
    counts = [1, 16, 256] if args.quick else [1, 2, 4, 8, 16, 32, 64, 128, 256]
    for tokens in counts:
        shape = {"tokens": tokens, **MODEL}
        for label, config in _variants(tokens).items():
            yield from _case(args, shape, tokens, label, config)


def _case(args, shape, tokens, label, config):

    def run(bounds, shape=shape, tokens=tokens, config=config, label=label):
        from tokenspeed.kernels.triton_ops import fused_moe as triton_moe

        def call(inp):
            if config is None:
                return fused_moe(*inp.args)
            return triton_moe.fused_moe(*inp.args, config=config)

        def make(i, shape=shape):
            return make_inputs("moe.experts", shape, torch.bfloat16, "cuda", seed=i)

        first = make(0)
        experts_used = int(torch.unique(first.args[4]).numel())
        h, i = MODEL["hidden"], MODEL["intermediate"]
        weight_bytes = experts_used * 3 * i * h * 2
        act_bytes = tokens * h * 2 * 2 + tokens * MODEL["top_k"] * (i + h) * 2 * 2
        timing, sets = time_op(call, make, lambda inp: inp.nbytes(), args.replays)
        seconds = timing.median_us * 1e-6
        gbps = (weight_bytes + act_bytes) / seconds / 1e9
        tflops = 2 * 3 * tokens * MODEL["top_k"] * h * i / seconds / 1e12
        return {**shape, "variant": label, "config": config, "median_us": timing.median_us, "timing": timing.method, "input_sets": sets,
                "experts_used": experts_used, "bytes": weight_bytes + act_bytes, "gbps": gbps,
                "fraction_of_copy_bw": gbps / bounds["copy_gbps"], "tflops": tflops,
                "fraction_of_matmul": tflops / bounds["bf16_tflops"]}  # fmt: skip

    suffix = "" if config is None else f" [{label}]"
    yield f"fused_moe tokens={tokens}{suffix}", run


if __name__ == "__main__":
    sys.exit(run_benchmark("fused_moe", __doc__, cases))
