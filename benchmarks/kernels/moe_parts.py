"""Where the time of a small-batch fused MoE goes: each launch timed alone, beside peers.

Issue #7's one-token target (75 % of the weight-read bound at Qwen3-30B-A3B shapes) is
missed at ~63 % with two launches (gate/up, then down). This script times the gate/up launch
and the down launch separately over a grid of their configurations, the whole default call,
and two peers that read the same bytes in one launch: cuBLAS GEMVs (``torch.mv``) over one
contiguous matrix of each launch's weight bytes, and ``torch.sum`` over the same matrices.
Every part is checked against the torch reference before it is timed. Timing: CUDA-graph
replay over rotating input sets larger than the L2, median.

    python3 benchmarks/kernels/moe_parts.py --tokens 1,2 --out parts.json [--grid quick|base|wide-k]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

MOE = {"hidden": 2048, "intermediate": 768, "num_experts": 128, "top_k": 8}
DTYPE = torch.bfloat16


def _weights() -> tuple[torch.Tensor, torch.Tensor]:
    h, i, e = MOE["hidden"], MOE["intermediate"], MOE["num_experts"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    w13 = torch.randn(e, 2 * i, h, generator=gen, device="cuda").mul_(h**-0.5).to(DTYPE)
    w2 = torch.randn(e, h, i, generator=gen, device="cuda").mul_(i**-0.5).to(DTYPE)
    return w13, w2


def _sets(tokens: int, w13: torch.Tensor, w2: torch.Tensor, l2: int) -> list[dict[str, Any]]:
    """Inputs with their own routing until the experts touched exceed three times the L2."""
    h, i, e, k = MOE["hidden"], MOE["intermediate"], MOE["num_experts"], MOE["top_k"]
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    per_expert = 3 * i * h * 2
    sets: list[dict[str, Any]] = []
    while not sets or (sum(s["used"] for s in sets) * per_expert < 3 * l2 and len(sets) < 16):
        x = torch.randn(tokens, h, generator=gen, device="cuda").to(DTYPE)
        weights, ids = torch.rand(tokens, e, generator=gen, device="cuda").topk(k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        ids32 = ids.to(torch.int32)
        sets.append({
            "x": x, "weights": weights, "ids": ids32, "flat_ids": ids32.reshape(-1),
            "flat_w": weights.reshape(-1).float(),
            "act": torch.empty(tokens * k, i, dtype=DTYPE, device="cuda"),
            "used": int(torch.unique(ids).numel()),
        })  # fmt: skip
    return sets


def _act_reference(s: dict[str, Any], w13: torch.Tensor) -> torch.Tensor:
    i = MOE["intermediate"]
    pairs = torch.arange(s["flat_ids"].numel(), device="cuda")
    x = s["x"].float()[pairs // MOE["top_k"]]
    w = w13[s["flat_ids"].long()].float()  # [pairs, 2i, h]
    gu = torch.einsum("ph,pnh->pn", x, w)
    return torch.nn.functional.silu(gu[:, :i]) * gu[:, i:]


def _close(out: torch.Tensor, ref: torch.Tensor) -> bool:
    err = (out.float() - ref.float()).abs()
    return bool(torch.isfinite(out).all()) and bool((err <= 2e-2 + 2e-2 * ref.float().abs()).all())


def _gate_up_configs(grid: str) -> Iterator[dict[str, Any]]:
    """``quick``: the default only; ``base``: tiles around it; ``wide-k``: long K tiles, so
    each weight row is read in a few long contiguous runs rather than many 256-byte ones."""
    ns, ks, warps, stages = (16, 32, 64), (64, 128, 256), (4,), (3, 4, 6)
    if grid == "quick":
        ns, ks, stages = (32,), (128,), (4,)
    elif grid == "wide-k":
        yield {"path": "sortfree", "block_m": 16, "block_n": 32, "block_k": 128,
               "num_warps": 4, "num_stages": 4}  # the default, for reference  # fmt: skip
        ns, ks, warps, stages = (16, 32), (512, 1024), (4, 8), (2, 3, 4)
    for n, k, w, s in itertools.product(ns, ks, warps, stages):
        if (s - 1) * (16 + 2 * n) * k * 2 > 200 << 10:  # x, gate and up tiles per buffer
            continue  # more shared memory than an SM has
        yield {"path": "sortfree", "block_m": 16, "block_n": n, "block_k": k,
               "num_warps": w, "num_stages": s}  # fmt: skip
    if grid == "base":
        for w in (2, 8):
            yield {"path": "sortfree", "block_m": 16, "block_n": 32, "block_k": 128,
                   "num_warps": w, "num_stages": 4}  # fmt: skip


def _down_configs(grid: str) -> Iterator[dict[str, Any]]:
    ns, ks, warps, stages = (8, 16, 32), (128, 256), (2, 4), (3, 4, 6)
    if grid == "quick":
        ns, ks, warps, stages = (16,), (256,), (4,), (4,)
    elif grid == "wide-k":
        yield {"down": "token", "down_block_n": 16, "down_block_k": 256, "down_num_warps": 4,
               "down_num_stages": 6, "num_warps": 4, "num_stages": 4}  # the default  # fmt: skip
        ns, ks, warps, stages = (8, 16, 32), (512, 1024), (2, 4), (2, 3, 4)
    for n, k, w, s in itertools.product(ns, ks, warps, stages):
        yield {"down": "token", "down_block_n": n, "down_block_k": k, "down_num_warps": w,
               "down_num_stages": s, "num_warps": 4, "num_stages": 4}  # fmt: skip


def _full_configs() -> Iterator[tuple[str, dict[str, Any]]]:
    """Whole calls with the default gate/up and the down launches the parts grid ranks best."""
    gate_up = {"path": "sortfree", "down": "token", "block_m": 16, "block_n": 32,
               "block_k": 128, "num_warps": 4, "num_stages": 4}  # fmt: skip
    downs = {"n16k256w4s4": (16, 256, 4, 4), "n16k256w4s6": (16, 256, 4, 6),
             "n8k256w2s6": (8, 256, 2, 6)}  # fmt: skip
    for label, (n, k, w, st) in downs.items():
        yield f"down {label}", {**gate_up, "down_block_n": n, "down_block_k": k,
                                "down_num_warps": w, "down_num_stages": st}  # fmt: skip


def _time(fn: Callable[[Any], Any], sets: list[Any]) -> float:
    from tokenspeed.kernels.timing import time_gpu

    return time_gpu(fn, sets, replays=40).median_us


def _row(part: str, cfg: Any, us: float, nbytes: float, copy: float, ok: bool) -> dict[str, Any]:
    gbps = nbytes / (us * 1e-6) / 1e9
    return {"part": part, "config": cfg, "median_us": us, "bytes": nbytes, "gbps": gbps,
            "fraction_of_copy_bw": gbps / copy, "correct": ok}  # fmt: skip


def run(tokens: int, grid: str, full_only: bool, copy: float, w13: torch.Tensor, w2: torch.Tensor,
        l2: int) -> list[dict[str, Any]]:  # fmt: skip
    from tokenspeed.kernels.reference.moe import fused_moe as reference
    from tokenspeed.kernels.triton_ops import fused_moe as fm

    h, i, k = MOE["hidden"], MOE["intermediate"], MOE["top_k"]
    sets = _sets(tokens, w13, w2, l2)
    used = sum(s["used"] for s in sets) / len(sets)
    gu_bytes, down_bytes = used * 2 * i * h * 2, used * h * i * 2
    rows: list[dict[str, Any]] = []
    s0 = sets[0]
    act_ref = _act_reference(s0, w13)

    def emit(row: dict[str, Any]) -> None:
        row["tokens"] = tokens
        print(json.dumps(row), flush=True)
        rows.append(row)

    # the whole default call
    want = reference(s0["x"], w13, w2, s0["weights"], s0["ids"])
    full = lambda s: fm.fused_moe(s["x"], w13, w2, s["weights"], s["ids"])  # noqa: E731
    emit(_row("full default", None, _time(full, sets), gu_bytes + down_bytes, copy,
              _close(full(s0), want)))  # fmt: skip
    for label, cfg in _full_configs():

        def call(s: dict[str, Any], cfg: dict[str, Any] = cfg) -> torch.Tensor:
            return fm.fused_moe(s["x"], w13, w2, s["weights"], s["ids"], config=cfg)

        try:
            ok = _close(call(s0), want)
            emit(_row(f"full {label}", cfg, _time(call, sets), gu_bytes + down_bytes, copy, ok))
        except Exception as err:
            emit({"part": f"full {label}", "config": cfg, "error": repr(err)[:300]})
    if full_only:
        return rows
    for cfg in _gate_up_configs(grid):

        def gate_up(s: dict[str, Any], cfg: dict[str, Any] = cfg) -> None:
            fm._sortfree_gate_up(s["x"], w13, s["act"], s["flat_ids"], k, cfg)

        try:
            gate_up(s0)
            ok = _close(s0["act"], act_ref)
            emit(_row("gate_up", cfg, _time(gate_up, sets), gu_bytes, copy, ok))
        except Exception as err:  # a config that does not compile is recorded
            emit({"part": "gate_up", "config": cfg, "error": repr(err)[:300]})
    for s in sets:  # the down launch reads real activations
        fm._sortfree_gate_up(s["x"], w13, s["act"], s["flat_ids"], k,
                             {"block_m": 16, "block_n": 32, "block_k": 128, "num_warps": 4,
                              "num_stages": 4})  # fmt: skip
    for cfg in _down_configs(grid):

        def down(s: dict[str, Any], cfg: dict[str, Any] = cfg) -> torch.Tensor:
            return fm._token_down(s["act"], w2, s["flat_w"], s["flat_ids"], tokens, k, DTYPE, cfg)

        try:
            ok = _close(down(s0), want)
            emit(_row("down", cfg, _time(down, sets), down_bytes, copy, ok))
        except Exception as err:
            emit({"part": "down", "config": cfg, "error": repr(err)[:300]})
    # the fastest correct gate/up and down launches of the grid, as one call
    best = {}
    for part in ("gate_up", "down"):
        timed = [r for r in rows if r["part"] == part and r.get("correct")]
        if timed:
            best[part] = min(timed, key=lambda r: r["median_us"])["config"]
    if len(best) == 2:
        combo = {**best["gate_up"], **best["down"], "path": "sortfree"}

        def combined(s: dict[str, Any]) -> torch.Tensor:
            return fm.fused_moe(s["x"], w13, w2, s["weights"], s["ids"], config=combo)

        emit(_row("full best parts", combo, _time(combined, sets), gu_bytes + down_bytes, copy,
                  _close(combined(s0), want)))  # fmt: skip
    # peers: one launch over one contiguous matrix of the same bytes
    n_sets = max(2, -(-3 * l2 // int(gu_bytes)))
    for name, rows_, cols, nbytes in (("gate_up", int(used) * 2 * i, h, gu_bytes),
                                      ("down", h, int(used) * i, down_bytes)):  # fmt: skip
        mats = [(torch.randn(rows_, cols, device="cuda", dtype=DTYPE),
                 torch.randn(cols, device="cuda", dtype=DTYPE)) for _ in range(n_sets)]  # fmt: skip
        emit(_row(f"peer cuBLAS mv ({name} bytes)", None,
                  _time(lambda m: torch.mv(m[0], m[1]), mats), nbytes, copy, True))  # fmt: skip
        total = lambda m: m[0].sum(dtype=torch.float32)  # noqa: E731
        emit(_row(f"peer torch.sum ({name} bytes)", None, _time(total, mats), nbytes, copy, True))
        del mats
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="1,2")
    parser.add_argument("--grid", choices=("quick", "base", "wide-k"), default="base")
    parser.add_argument("--full-only", action="store_true", help="whole calls only")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("moe_parts: needs a CUDA device", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import environment

    from tokenspeed.kernels.timing import device_roofline, l2_bytes

    bounds = device_roofline()
    print(f"copy {bounds['copy_gbps']:.0f} GB/s, matmul {bounds['bf16_tflops']:.0f} TFLOP/s")
    w13, w2 = _weights()
    rows = []
    for t in (int(x) for x in args.tokens.split(",")):
        rows += run(t, args.grid, args.full_only, bounds["copy_gbps"], w13, w2, l2_bytes())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"environment": environment(), "bounds": bounds,
                                    "moe": MOE, "results": rows}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
