"""How fast one SM widens e4m3 to f16 in registers, measured on the GPU.

An FP8 decode that widens its cache in the consumer's registers (no widened copy in shared
memory) lives or dies by the rate of ``cvt.rn.f16x2.e4m3x2`` (SASS ``F2FP``): the 16-row
kernel would widen about 35 000 values per 64-token tile, and HBM delivers a tile per SM every
~1.2 us at 95 % of the copy bandwidth. This times that conversion, and for scale the integer
route the bf16 widening takes (byte permute, two logic ops, one packed multiply) and plain
32-bit logic, each as many independent chains per thread, and reports results per clock per
SM (the clock read with ``%clock64`` against ``%globaltimer`` in the same kernel):

    python3 benchmarks/mla/fp8_widen_rate.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

# one step of each chain: a 32-bit word in, a 32-bit word out, so steps chain; ``values`` is
# how many e4m3 values (or 16-bit halves) the step widens
CVT = """{ .reg .b16 l, h; .reg .b32 a, b;
  mov.b32 {l, h}, $1;
  cvt.rn.f16x2.e4m3x2 a, l;
  cvt.rn.f16x2.e4m3x2 b, h;
  xor.b32 $0, a, b; }"""
# the bf16 route for the same four bytes: two byte permutes, then per pair sign and shifted
# magnitude, one bf16x2 multiply each
INT_BF16 = """{ .reg .b32 a, b, m, k;
  mov.b32 k, 0x7b807b80;
  prmt.b32 a, $1, 0, 0x1404;
  prmt.b32 b, $1, 0, 0x3424;
  and.b32 m, a, 0x80008000; shr.b32 a, a, 4; and.b32 a, a, 0x07ff07ff; or.b32 a, a, m;
  and.b32 m, b, 0x80008000; shr.b32 b, b, 4; and.b32 b, b, 0x07ff07ff; or.b32 b, b, m;
  mul.rn.bf16x2 a, a, k;
  mul.rn.bf16x2 b, b, k;
  xor.b32 $0, a, b; }"""
LOGIC = """{ .reg .b32 a, b;
  xor.b32 a, $1, 0x1234;
  and.b32 b, $1, 0x7777;
  xor.b32 $0, a, b; }"""
STEPS = {
    "cvt e4m3x2->f16x2": (CVT, 4),
    "bf16 integer route (approx.)": (INT_BF16, 4),
    "logic": (LOGIC, 0),
}


@triton.jit
def _read(x, REG: tl.constexpr):  # pragma: no cover - GPU only
    return tl.inline_asm_elementwise(
        "mov.u64 $0, " + REG + ";", "=l,r", [x], dtype=tl.int64, is_pure=False, pack=1
    )


@triton.jit
def _chains(
    x_ptr, out_ptr, clk_ptr, iters, ASM: tl.constexpr, BLOCK: tl.constexpr
):  # pragma: no cover - GPU only
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    # the clock reads take the chains' words as (unused) inputs so they stay outside the loop
    t0 = _read(x, "%clock64")
    g0 = _read(x, "%globaltimer")
    for _ in range(iters):
        x = tl.inline_asm_elementwise(ASM, "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)
    t1 = _read(x, "%clock64")
    g1 = _read(x, "%globaltimer")
    tl.store(out_ptr + offs, x)
    tl.store(clk_ptr + 2 * pid, tl.max(t1 - t0, 0))
    tl.store(clk_ptr + 2 * pid + 1, tl.max(g1 - g0, 0))


def measure(asm: str, iters: int = 4096, block: int = 2048, warps: int = 4) -> dict[str, float]:
    """Steps per clock per SM for ``asm`` over a grid of 8 programs per SM."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = 8 * sms
    x = torch.randint(0, 2**31 - 1, (grid * block,), dtype=torch.int32, device="cuda")
    out = torch.empty_like(x)
    clk = torch.empty(2 * grid, dtype=torch.int64, device="cuda")
    run = lambda: _chains[(grid,)](x, out, clk, iters, ASM=asm, BLOCK=block, num_warps=warps)  # noqa: E731
    run()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        run()
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / 5
    cycles_per_ns = (clk[0::2].double() / clk[1::2].double()).median().item()
    steps = grid * block * iters
    return {
        "seconds": seconds,
        "sm_ghz": cycles_per_ns,
        "steps_per_clock_per_sm": steps / (seconds * cycles_per_ns * 1e9) / sms,
    }


def main(argv: list[str] | None = None) -> int:
    """Time each step kind; JSON to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    rows = []
    for name, (asm, values) in STEPS.items():
        r = measure(asm)
        r.update(step=name, values_per_step=values)
        if values:
            r["values_per_clock_per_sm"] = r["steps_per_clock_per_sm"] * values
        rows.append(r)
        print(json.dumps(r))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
