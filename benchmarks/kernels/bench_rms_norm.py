"""RMSNorm and fused residual-add + RMSNorm, hidden 4096-8192, 1-16k tokens, bf16.

Bytes moved: read x (and residual), write the output (and residual_out), read the weight.
Reported as the fraction of device-copy bandwidth.

    python benchmarks/kernels/bench_rms_norm.py --out rmsnorm.json
"""

from __future__ import annotations

import sys

import torch
from common import run_benchmark, time_op

from tokenspeed.kernels import fused_add_rms_norm, rms_norm
from tokenspeed.kernels.workloads import make_inputs


def cases(args):
    tokens_list = [1, 256, 16384] if args.quick else [1, 16, 256, 1024, 4096, 16384]
    for op, fn in (("norm.rms", rms_norm), ("norm.fused_add_rms", fused_add_rms_norm)):
        for hidden in (4096, 8192):
            for tokens in tokens_list:
                shape = {"tokens": tokens, "hidden": hidden}

                def run(bounds, op=op, fn=fn, shape=shape):
                    def make(i, shape=shape):
                        return make_inputs(op, shape, torch.bfloat16, "cuda", seed=i)

                    timing, sets = time_op(
                        lambda inp: fn(*inp.args), make, lambda inp: inp.nbytes(), args.replays
                    )
                    rows = 2 if op == "norm.rms" else 4  # tensors of [T, H] read or written
                    moved = rows * shape["tokens"] * shape["hidden"] * 2 + shape["hidden"] * 2
                    gbps = moved / (timing.median_us * 1e-6) / 1e9
                    return {"op": op, **shape, "median_us": timing.median_us, "timing": timing.method,
                            "input_sets": sets, "bytes": moved, "gbps": gbps,
                            "fraction_of_copy_bw": gbps / bounds["copy_gbps"]}  # fmt: skip

                yield f"{op} hidden={hidden} tokens={tokens}", run


if __name__ == "__main__":
    sys.exit(run_benchmark("rms_norm", __doc__, cases))
