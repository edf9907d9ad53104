"""Extend/prefill attention, head dim 128, 16k tokens, vs SDPA (cuDNN and flash) in the same run.

FLOPs: 4 * T^2 * Hq * D for full attention, half of that causal. Cases: ``tokenspeed`` (the
op, whatever the registry picks: the SDPA candidate here, batch 1 without prefix), ``triton``
(the Triton kernel forced, default config, plus two Hopper configs), the SDPA candidate with
native GQA, and the raw SDPA baselines. Our cases read K/V from the paged cache (the new
tokens already stored); the raw SDPA baselines get contiguous K/V expanded to all query
heads (its GQA path is not used so every backend sees the same problem).

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


# (label, kernel override or None for the registry's choice, explicit Triton config or None)
VARIANTS = (
    ("tokenspeed", None, None),  # what the registry picks (SDPA candidate where feasible)
    ("triton", "triton_paged_extend", None),  # the Triton kernel, default config
    ("triton-128x128-w8-s3", "triton_paged_extend",
     {"block_m": 128, "block_n": 128, "num_warps": 8, "num_stages": 3}),
    ("triton-128x64-w8-s4", "triton_paged_extend",
     {"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 4}),
    ("sdpa-candidate-native-gqa", "sdpa_paged_extend", {"gqa": "native"}),
)  # fmt: skip


def _chosen_kernel() -> str:
    from tokenspeed.kernels import selection_records

    recs = [r for r in selection_records() if r["op"] == "attention.extend"]
    return recs[-1]["kernel"] if recs else "?"


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
            for label, kernel, config in VARIANTS:

                def run(bounds, shape=shape, causal=causal, label=label, kernel=kernel,
                        config=config):  # fmt: skip
                    from tokenspeed.kernels import kernel_override
                    from tokenspeed.kernels.torch_ops import sdpa_extend
                    from tokenspeed.kernels.triton_ops import extend_attention

                    def make(i, shape=shape):
                        return make_inputs(
                            "attention.extend", shape, torch.bfloat16, "cuda", seed=i
                        )

                    if config is not None:
                        impl = sdpa_extend if kernel.startswith("sdpa") else extend_attention

                        def call(inp):
                            return impl.paged_extend_attention(*inp.args, config=config)
                    elif kernel is not None:

                        def call(inp):
                            with kernel_override("attention.extend", kernel):
                                return paged_extend_attention(*inp.args)
                    else:

                        def call(inp):
                            return paged_extend_attention(*inp.args)

                    timing, _ = time_op(call, make, lambda _: 1 << 40, args.replays)
                    tflops = _flops(TOKENS, causal) / (timing.median_us * 1e-6) / 1e12
                    chosen = _chosen_kernel() if config is None else kernel
                    return {"kernel": label, "selected": chosen, "config": config, **shape,
                            "median_us": timing.median_us, "tflops": tflops,
                            "fraction_of_matmul": tflops / bounds["bf16_tflops"]}  # fmt: skip

                yield f"{label} extend causal={causal} page={page_size}", run
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
    """Each variant's TFLOP/s against cuDNN's, per causal setting (printed after the run)."""
    import json

    rows = [r for r in json.loads(open(path).read())["results"] if "tflops" in r]
    labels = [v[0] for v in VARIANTS] + ["sdpa-flash"]
    for causal in (True, False):
        cudnn = max(
            (r["tflops"] for r in rows if r["kernel"] == "sdpa-cudnn" and r["causal"] == causal),
            default=0,
        )
        for label in labels:
            ours = [r for r in rows if r["kernel"] == label and r["causal"] == causal]
            if cudnn and ours:
                best = max(ours, key=lambda r: r["tflops"])
                print(
                    f"causal={causal}: {label} ({best.get('selected', label)}) "
                    f"{best['tflops']:.0f} vs cuDNN {cudnn:.0f} TFLOP/s = "
                    f"{best['tflops'] / cudnn:.2f}x"
                )


if __name__ == "__main__":
    status = run_benchmark("paged_extend_attention", __doc__, cases)
    out = sys.argv[sys.argv.index("--out") + 1]
    summarize(out)
    sys.exit(status)
