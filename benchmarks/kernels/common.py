"""Shared scaffolding for the kernel benchmarks: bounds, timing, JSON output.

Every script measures the device-copy bandwidth and the bf16 matmul rate in the same run
(the bounds its kernels are reported against), times with CUDA-graph replay over rotating
inputs larger than L2 (median of many replays), and writes one JSON file.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument(
        "--replays", type=int, default=50, help="CUDA-graph replays per case (median)"
    )
    parser.add_argument("--quick", action="store_true", help="fewer cases (smoke run)")
    return parser.parse_args()


def environment() -> dict[str, Any]:
    import triton

    props = torch.cuda.get_device_properties(0)
    return {
        "device": props.name,
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def run_benchmark(
    name: str,
    description: str,
    cases: Callable[
        [argparse.Namespace], Iterable[tuple[str, Callable[[dict[str, float]], dict[str, Any]]]]
    ],
) -> int:
    """Measure the bounds, run every case (a failing case is recorded, not fatal), write JSON."""
    args = parse_args(description)
    if not torch.cuda.is_available():
        print(f"{name}: needs a CUDA device", file=sys.stderr)
        return 2
    from tokenspeed.kernels.timing import device_roofline

    bounds = device_roofline()
    print(
        f"{name}: copy {bounds['copy_gbps']:.0f} GB/s, bf16 matmul {bounds['bf16_tflops']:.0f} TFLOP/s"
    )
    results, failed = [], 0
    for label, run in cases(args):
        try:
            row = {"case": label, **run(bounds)}
        except Exception as err:  # one broken case must not lose the others
            failed += 1
            row = {
                "case": label,
                "error": f"{type(err).__name__}: {err}",
                "traceback": traceback.format_exc(),
            }
        print(json.dumps({k: v for k, v in row.items() if k != "traceback"}))
        results.append(row)
        torch.cuda.empty_cache()
    from tokenspeed.kernels import selection_records

    report = {
        "benchmark": name,
        "environment": environment(),
        "bounds": bounds,
        "results": results,
        "selections": selection_records(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out} ({len(results) - failed}/{len(results)} cases ok)")
    return 1 if failed else 0


def time_op(
    fn: Callable[[Any], Any], make: Callable[[int], Any], nbytes: Callable[[Any], int], replays: int
):
    """Median microseconds per call of ``fn`` over rotating inputs ``make(i)``."""
    from tokenspeed.kernels.timing import rotating, time_gpu

    sets = rotating(make, nbytes)
    timing = time_gpu(fn, sets, replays=replays)
    return timing, len(sets)
