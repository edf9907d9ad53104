"""One paged GQA decode call at a sweep shape, bracketed for Nsight Compute.

    ncu --profile-from-start off --set full --clock-control none -o REPORT \\
        python3 benchmarks/kernels/profile_decode.py --batch 16 --kv-len 8192 --page 16 \\
        [--kernel cute|triton] [--config '{"cluster": 2, "stages": 2}']

Why: page-16 decode trails page 64 by 1.5-3 points of copy bandwidth on every H200 measured
(docs/performance.md); a profile of each page size says whether the consumers wait for tiles
(the copies) or the producer waits for free stages. Builds the sweep's inputs
(``sweep_gqa_moe.py``: Llama-3-8B heads, pages shuffled over the pool), runs the call twice
unprofiled (compile, warm state), then once between ``cudaProfilerStart``/``Stop``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_gqa_moe as sweep  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--kv-len", type=int, default=8192)
    parser.add_argument("--page", type=int, default=16)
    parser.add_argument("--kernel", choices=("cute", "triton"), default="cute")
    parser.add_argument(
        "--config", default=None, help="the kernel's config (JSON); default: its plan"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_decode: needs a CUDA device", file=sys.stderr)
        return 2
    inputs = sweep._decode_inputs({"batch": args.batch, "kv_len": args.kv_len,
                                   "page_size": args.page}, seed=0)  # fmt: skip
    cfg = json.loads(args.config) if args.config else None
    if args.kernel == "cute":
        from tokenspeed.kernels.cute_ops.decode_attention import paged_decode_attention
    else:
        from tokenspeed.kernels.triton_ops.decode_attention import paged_decode_attention

    def call() -> None:
        paged_decode_attention(*inputs, config=cfg)

    from tokenspeed.kernels.timing import profile_call

    profile_call(call)
    return 0


if __name__ == "__main__":
    sys.exit(main())
