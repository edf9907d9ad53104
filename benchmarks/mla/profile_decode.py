"""One MLA decode call (CuTe, Triton or the peer) at FlashMLA's shape, bracketed for Nsight Compute.

    ncu --profile-from-start off --set full -o REPORT \\
        python3 benchmarks/mla/profile_decode.py --heads 32 [--config '{"layout": "pairs"}']
    ... --kernel flashinfer     # the peer (FlashInfer's SM90 MLA kernel), where installed
    ... --kernel triton --config '{"tokens_on_m": 1}'  # the Triton decode (config: its plan keys)
    ... --heads 16 --fp8 token  # an e4m3 cache with per-token scales (or ``tensor``)

Builds the inputs of ``sweep_decode.py`` (batch 128 x 4096 tokens, page 64, bf16 or FP8), runs the
call twice unprofiled (compile, warm caches' state), then once between
``cudaProfilerStart``/``Stop`` so that only that call's kernels are profiled.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_decode import KV_LEN, SCALE, _inputs  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--q-len", type=int, default=1)
    parser.add_argument("--config", default="{}", help="the kernel's plan keys (JSON)")
    parser.add_argument("--kernel", choices=("cute", "triton", "flashinfer"), default="cute")
    parser.add_argument("--fp8", choices=("tensor", "token"), default="",
                        help="an FP8 cache with one scale per tensor or per token")  # fmt: skip
    args = parser.parse_args(argv)
    if args.fp8 and args.kernel == "flashinfer":
        parser.error("FlashInfer's SM90 MLA kernel takes no FP8 cache")
    from tokenspeed.mla import triton_decode

    inp = _inputs(args.heads, args.q_len, fp8=args.fp8)
    cfg = json.loads(args.config)
    out = inp["q"].new_empty(*inp["q"].shape[:-1], 512)
    peer = None
    if args.kernel == "flashinfer":
        from flashinfer_mla import FlashInferMlaDecode

        peer = FlashInferMlaDecode("fa3")

    def call() -> None:
        if peer is not None:
            peer(inp["q"], inp["cache"], inp["tables"], inp["seq"], SCALE, out)
            return
        if args.kernel == "triton":
            triton_decode.mla_decode(inp["q"], inp["cache"], inp["tables"], inp["seq"], SCALE,
                                     out=out, max_seq_len=KV_LEN, config=cfg or None,
                                     kv_scale=inp["scale"])  # fmt: skip
            return
        from tokenspeed.mla import cute_decode  # needs nvidia-cutlass-dsl

        cute_decode.mla_decode(inp["q"], inp["cache"], inp["tables"], inp["seq"], SCALE,
                               max_seq_len=KV_LEN, config=cfg, kv_scale=inp["scale"])  # fmt: skip

    from tokenspeed.kernels.timing import profile_call

    profile_call(call)
    return 0


if __name__ == "__main__":
    sys.exit(main())
