"""Extend/prefill attention, head dim 128, 16k tokens, vs SDPA (cuDNN and flash) in the same run.

FLOPs: 4 * T^2 * Hq * D for full attention, half of that causal. Our kernel reads K/V from
the paged cache (the new tokens already stored); SDPA gets contiguous K/V expanded to all
query heads (its GQA path is not used so every backend sees the same problem).

    python benchmarks/kernels/bench_extend_attention.py --out extend.json
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from common import run_benchmark, time_op
from torch.nn.attention import SDPBackend, sdpa_kernel

from tokenspeed.kernels import paged_extend_attention
from tokenspeed.kernels.workloads import make_inputs

HEADS = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128}
TOKENS = 16384


def _flops(tokens: int, causal: bool) -> float:
    full = 4.0 * tokens * tokens * HEADS["num_q_heads"] * HEADS["head_dim"]
    return full / 2 if causal else full


def cases(args):
    for causal in (True, False):
        for page_size in [64] if args.quick else [16, 64]:
            shape = {
                "batch": 1,
                "q_len": TOKENS,
                "prefix_len": 0,
                **HEADS,
                "page_size": page_size,
                "causal": causal,
            }

            def run(bounds, shape=shape, causal=causal):
                def make(i, shape=shape):
                    return make_inputs("attention.extend", shape, torch.bfloat16, "cuda", seed=i)

                timing, _ = time_op(
                    lambda inp: paged_extend_attention(*inp.args),
                    make,
                    lambda _: 1 << 40,
                    args.replays,
                )
                tflops = _flops(TOKENS, causal) / (timing.median_us * 1e-6) / 1e12
                return {"kernel": "tokenspeed", **shape, "median_us": timing.median_us, "tflops": tflops,
                        "fraction_of_matmul": tflops / bounds["bf16_tflops"]}  # fmt: skip

            yield f"tokenspeed extend causal={causal} page={page_size}", run
        for name, backend in (
            ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
            ("sdpa-flash", SDPBackend.FLASH_ATTENTION),
        ):

            def run_sdpa(bounds, backend=backend, causal=causal, name=name):
                gen = torch.Generator(device="cuda").manual_seed(0)
                shape = (1, HEADS["num_q_heads"], TOKENS, HEADS["head_dim"])
                q, k, v = (
                    torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)
                    for _ in range(3)
                )

                def call(_):
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                timing, _ = time_op(call, lambda i: None, lambda _: 1 << 40, args.replays)
                tflops = _flops(TOKENS, causal) / (timing.median_us * 1e-6) / 1e12
                return {"kernel": name, "causal": causal, "tokens": TOKENS, "median_us": timing.median_us,
                        "tflops": tflops, "fraction_of_matmul": tflops / bounds["bf16_tflops"]}  # fmt: skip

            yield f"{name} causal={causal}", run_sdpa


def summarize(path):
    """Ratio of our TFLOP/s to cuDNN's, per causal setting (printed after the run)."""
    import json

    rows = [r for r in json.loads(open(path).read())["results"] if "tflops" in r]
    for causal in (True, False):
        ours = max(
            (r["tflops"] for r in rows if r["kernel"] == "tokenspeed" and r["causal"] == causal),
            default=0,
        )
        cudnn = max(
            (r["tflops"] for r in rows if r["kernel"] == "sdpa-cudnn" and r["causal"] == causal),
            default=0,
        )
        if cudnn:
            print(
                f"causal={causal}: tokenspeed {ours:.0f} vs cuDNN {cudnn:.0f} TFLOP/s = {ours / cudnn:.2f}x"
            )


if __name__ == "__main__":
    status = run_benchmark("paged_extend_attention", __doc__, cases)
    out = sys.argv[sys.argv.index("--out") + 1]
    summarize(out)
    sys.exit(status)
