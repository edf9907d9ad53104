"""Compare every registered kernel with its op's reference on random shapes.

    python -m tokenspeed.kernels.numerics [--device cuda] [--dtype bfloat16] [--seed 0]

Prints a table (op, kernel, dtype, shape, max abs error, max relative error, verdict) and
exits non-zero if any kernel misses its dtype-aware tolerance. On CPU the Triton kernels
run in Triton's interpreter (float32/float16 only there: bf16 ``tl.dot`` is wrong in it).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

# Tolerance per dtype: |actual - expected| <= atol + rtol * |expected|, elementwise.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (6e-2, 6e-2),
}


@dataclass(frozen=True)
class NumericsResult:
    """One kernel on one workload."""

    op: str
    kernel: str
    dtype: str
    shape: str
    max_abs: float | None
    max_rel: float | None
    passed: bool | None  # None: skipped
    note: str = ""


def random_shape(op: str, rng: random.Random) -> dict[str, Any]:
    """A small random shape for ``op`` that still crosses block and page boundaries."""
    heads_kv = rng.choice([1, 2, 4])
    group = rng.choice([1, 2, 4, 8])
    head_dim = rng.choice([32, 64, 128])
    page = rng.choice([1, 4, 16])
    shapes: dict[str, dict[str, Any]] = {
        "norm.rms": {"tokens": rng.randint(1, 40), "hidden": rng.choice([64, 200, 1024, 4096])},
        "norm.fused_add_rms": {"tokens": rng.randint(1, 40), "hidden": rng.choice([64, 200, 2048])},
        "rotary.apply": {
            "tokens": rng.randint(1, 40),
            "num_q_heads": heads_kv * group,
            "num_kv_heads": heads_kv,
            "head_dim": head_dim,
            "rot_dim": rng.choice([head_dim, head_dim // 2]),
            "is_neox": rng.random() < 0.5,
        },
        "activation.silu_and_mul": {
            "tokens": rng.randint(1, 40),
            "intermediate": rng.choice([64, 300, 1536]),
        },
        "kv_cache.store": {
            "tokens": rng.randint(1, 40),
            "num_kv_heads": heads_kv,
            "head_dim": head_dim,
            "page_size": page,
        },
        "attention.decode": {
            "batch": rng.randint(1, 6),
            "kv_len": rng.randint(1, 300),
            "num_q_heads": heads_kv * group,
            "num_kv_heads": heads_kv,
            "head_dim": head_dim,
            "page_size": page,
        },
        "attention.extend": {
            "batch": rng.randint(1, 3),
            "q_len": rng.randint(1, 70),
            "prefix_len": rng.choice([0, rng.randint(1, 100)]),
            "num_q_heads": heads_kv * group,
            "num_kv_heads": heads_kv,
            "head_dim": head_dim,
            "page_size": page,
        },
        "moe.route": rng.choice(
            [
                {"tokens": rng.randint(1, 40), "num_experts": 64, "top_k": 6, "scoring": "softmax"},
                {
                    "tokens": rng.randint(1, 40),
                    "num_experts": 128,
                    "top_k": 8,
                    "scoring": "softmax",
                },
                {
                    "tokens": rng.randint(1, 40),
                    "num_experts": 256,
                    "top_k": 8,
                    "scoring": "sigmoid",
                    "n_group": 8,
                    "topk_group": 4,
                },
            ]
        ),
        "moe.experts": {
            "tokens": rng.randint(1, 40),
            "hidden": rng.choice([64, 128]),
            "intermediate": rng.choice([32, 96]),
            "num_experts": rng.choice([4, 8, 16]),
            "top_k": rng.choice([1, 2, 4]),
        },
    }
    return shapes[op]


def _compare(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], dtype: torch.dtype):
    atol, rtol = TOLERANCES[dtype]
    max_abs = max_rel = 0.0
    ok = True
    for a, e in zip(actual, expected, strict=True):
        a64, e64 = a.detach().double().cpu(), e.detach().double().cpu()
        err = (a64 - e64).abs()
        if err.numel():
            max_abs = max(max_abs, float(err.max()))
            max_rel = max(max_rel, float(err.max() / e64.abs().max().clamp_min(1e-12)))
            ok &= bool((err <= atol + rtol * e64.abs()).all())
    return max_abs, max_rel, ok


def _route_dense(result: tuple[torch.Tensor, torch.Tensor], num_experts: int) -> torch.Tensor:
    """Routing as a dense [T, E] weight matrix (so order among equal picks cannot matter)."""
    weights, ids = result
    dense = torch.zeros(weights.shape[0], num_experts, dtype=torch.float32, device=weights.device)
    return dense.scatter_(1, ids.long(), weights.float())


def check_op(
    op: str, shape: dict[str, Any], dtype: torch.dtype, device: torch.device, seed: int
) -> list[NumericsResult]:
    """Run every non-reference kernel of ``op`` on one workload and compare with the reference."""
    from . import registry
    from .overrides import kernel_override
    from .selection import KernelSelectionError
    from .workloads import call_op, make_inputs, outputs

    family, mode = op.split(".")
    specs = registry.candidates(family, mode)
    reference = next(s for s in specs if s.band == registry.Priority.REFERENCE)
    shape_text = ",".join(f"{k}={v}" for k, v in shape.items())

    def run(kernel: str) -> tuple[torch.Tensor, ...]:
        inputs = make_inputs(op, shape, dtype, device, seed)
        with kernel_override(op, kernel):
            result = call_op(op, inputs)
        if op == "moe.route":
            return (_route_dense(result, shape["num_experts"]),)
        return outputs(op, inputs, result)

    expected = run(reference.name)
    results = []
    for spec in specs:
        if spec is reference:
            continue
        try:
            actual = run(spec.name)
        except KernelSelectionError as err:
            note = str(err).split(": ", 1)[-1].split(". Registered")[0]
            results.append(
                NumericsResult(op, spec.name, _name(dtype), shape_text, None, None, None, note)
            )
            continue
        max_abs, max_rel, ok = _compare(actual, expected, dtype)
        results.append(
            NumericsResult(op, spec.name, _name(dtype), shape_text, max_abs, max_rel, ok)
        )
    return results


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def run_numerics(
    device: torch.device, dtypes: Sequence[torch.dtype], ops: Sequence[str], trials: int, seed: int
) -> list[NumericsResult]:
    """Every op x dtype x trial; returns all results."""
    rng = random.Random(seed)
    results = []
    for op in ops:
        for dtype in dtypes:
            for trial in range(trials):
                results.extend(check_op(op, random_shape(op, rng), dtype, device, seed + trial))
    return results


def render(results: Sequence[NumericsResult]) -> None:
    """Print the results as a rich table."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="TokenSpeed kernel numerics (vs torch reference)")
    for col in ("op", "kernel", "dtype", "shape", "max abs", "max rel", "result"):
        table.add_column(col, overflow="fold")
    for r in results:
        verdict = (
            "[yellow]skip[/]"
            if r.passed is None
            else "[green]PASS[/]"
            if r.passed
            else "[red]FAIL[/]"
        )
        table.add_row(
            r.op,
            r.kernel,
            r.dtype,
            r.shape,
            "-" if r.max_abs is None else f"{r.max_abs:.2e}",
            "-" if r.max_rel is None else f"{r.max_rel:.2e}",
            verdict + (f" {r.note}" if r.note else ""),
        )
    console = Console()
    Console(width=max(console.width, 180)).print(table)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: returns the exit status (1 when any kernel fails)."""
    from .workloads import SHAPE_KEYS

    parser = argparse.ArgumentParser(
        prog="python -m tokenspeed.kernels.numerics", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", action="append", choices=[_name(d) for d in TOLERANCES])
    parser.add_argument("--ops", nargs="*", default=list(SHAPE_KEYS), choices=list(SHAPE_KEYS))
    parser.add_argument("--trials", type=int, default=2, help="random shapes per op and dtype")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any Triton kernel is imported
    default = ["float32", "float16"] if device.type == "cpu" else ["bfloat16", "float16", "float32"]
    dtypes = [getattr(torch, d) for d in (args.dtype or default)]
    results = run_numerics(device, dtypes, args.ops, args.trials, args.seed)
    render(results)
    failed = [r for r in results if r.passed is False]
    checked = sum(r.passed is not None for r in results)
    print(
        f"{checked - len(failed)}/{checked} kernel checks passed, {len(results) - checked} skipped"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
