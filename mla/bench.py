"""MLA kernel benchmark: decode at FlashMLA's shapes, prefill against SDPA (cuDNN), one run.

    python -m tokenspeed.mla.bench [--out FILE] [--quick] [--sweep] [--only PREFIX] [--replays N]

Measures the device-copy bandwidth and the bf16 matmul rate first (``device_roofline``), then:

* decode: batch 128, KV length 4096, 16/32/64/128 heads, q_len 1 and 2, page size 64, bf16
  cache and FP8 (e4m3, per-tensor scale) cache. Bytes = (total KV tokens x 576 x cache
  element size) + (B x H x q_len x 1088 x 2) for the bf16 query and output; FLOPs =
  2 x B x H x q_len x KV length x 1088. Reported as fractions of the copy bandwidth and
  the matmul rate measured in the same run.
* prefill: one request of 8k and 32k tokens, 128 heads, q/k head dim 192, v 128, causal:
  ``scaled_dot_product_attention`` with the cuDNN backend, ``mla_prefill`` (the registry's
  choice: the SDPA candidate for this shape) and the Triton kernel with each launch variant
  of ``configs.PREFILL_VARIANTS`` (``--prefill-variants a,b`` to pick), on the same tensors;
  TFLOP/s, the ratio to cuDNN and the max abs difference from cuDNN's output.
  FLOPs = 2 x H x (visible q-k pairs) x (192 + 128).
* ``--sweep``: also times decode launch configs (row block, KV tile, warps, stages, splits)
  per shape, within ``--sweep-seconds``, and reports the best found.

Prints a rich table and writes JSON (``--out``). Timing: CUDA-graph replay over input sets
rotated beyond twice the L2 size, median of ``--replays``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

DECODE_BATCH, DECODE_KV, PAGE = 128, 4096, 64
RANK, ROPE = 512, 64
PREFILL_HEADS, PREFILL_QK, PREFILL_V = 128, 192, 128

Row = dict[str, Any]


def _timing(fn: Callable[[Any], Any], make: Callable[[int], Any], nbytes: int, replays: int):
    from tokenspeed.kernels.timing import rotating, time_gpu

    sets = rotating(make, lambda _: nbytes)
    return time_gpu(fn, sets, replays=replays), len(sets)


def _decode_inputs(heads: int, q_len: int, fp8: bool, seed: int) -> dict[str, Any]:
    """FlashMLA's decode problem: every request KV_LEN tokens on randomly placed pages."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    pages_per = DECODE_KV // PAGE
    total = DECODE_BATCH * pages_per
    perm = torch.randperm(total, generator=gen, device="cuda").to(torch.int32)
    tables = perm.view(DECODE_BATCH, pages_per)
    cache = torch.randn(total, PAGE, RANK + ROPE, generator=gen, device="cuda")
    cache = cache.mul_(0.5).to(torch.bfloat16)
    scale = None
    if fp8:
        scale = torch.tensor([0.5 * 4.5 / 448], device="cuda")
        cache = (cache.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    q = torch.randn(DECODE_BATCH, q_len, heads, RANK + ROPE, generator=gen, device="cuda")
    seq = torch.full((DECODE_BATCH,), DECODE_KV, dtype=torch.int32, device="cuda")
    return {"q": q.to(torch.bfloat16), "cache": cache, "tables": tables, "seq": seq, "scale": scale}


def _decode_metrics(heads: int, q_len: int, elem: int, us: float, bounds: dict) -> Row:
    kv_bytes = DECODE_BATCH * DECODE_KV * (RANK + ROPE) * elem
    io_bytes = DECODE_BATCH * heads * q_len * (RANK + ROPE + RANK) * 2
    flops = 2.0 * DECODE_BATCH * heads * q_len * DECODE_KV * (RANK + ROPE + RANK)
    gbps = (kv_bytes + io_bytes) / (us * 1e-6) / 1e9
    tflops = flops / (us * 1e-6) / 1e12
    return {
        "median_us": us,
        "bytes": kv_bytes + io_bytes,
        "flops": flops,
        "gbps": gbps,
        "tflops": tflops,
        "frac_copy_bw": gbps / bounds["copy_gbps"],
        "frac_matmul": tflops / bounds["bf16_tflops"],
    }


def decode_case(heads: int, q_len: int, fp8: bool, args: argparse.Namespace, bounds: dict) -> Row:
    """Time ``mla_decode`` (the registry's choice) on one FlashMLA shape."""
    from tokenspeed.mla import mla_decode, mla_decode_plan

    probe = _decode_inputs(heads, q_len, fp8, 0)
    plan = mla_decode_plan(probe["q"], probe["cache"], probe["tables"], max_seq_len=DECODE_KV)
    workspace = torch.empty(max(1, plan.workspace_bytes), dtype=torch.uint8, device="cuda")
    out = torch.empty(DECODE_BATCH, q_len, heads, RANK, dtype=torch.bfloat16, device="cuda")
    scale = 1 / math.sqrt(192)
    del probe

    def call(inp: dict[str, Any]) -> None:
        mla_decode(inp["q"], inp["cache"], inp["tables"], inp["seq"], scale, out=out,
                   kv_scale=inp["scale"], workspace=workspace, max_seq_len=DECODE_KV)  # fmt: skip

    elem = 1 if fp8 else 2
    nbytes = DECODE_BATCH * DECODE_KV * (RANK + ROPE) * elem
    timing, sets = _timing(call, lambda i: _decode_inputs(heads, q_len, fp8, i), nbytes,
                           args.replays)  # fmt: skip
    return {
        "kernel": plan.kernel,
        "num_splits": plan.num_splits,
        "fold_sq_factor": plan.fold_sq_factor,
        "block_h": plan.block_h,
        "timing": timing.method,
        "input_sets": sets,
        **_decode_metrics(heads, q_len, elem, timing.median_us, bounds),
    }


def sweep_configs() -> list[dict[str, int]]:
    """Decode launch variants worth trying on Hopper (each compiles once)."""
    out = []
    for block_h, block_n, warps, stages, reload, tokens_on_m in [
        (64, 32, 8, 3, 0, 0), (64, 32, 8, 3, 1, 0), (64, 32, 8, 4, 0, 0), (64, 64, 8, 2, 0, 0),
        (64, 64, 8, 1, 1, 0), (64, 16, 8, 4, 1, 0), (32, 32, 4, 3, 0, 0), (32, 64, 4, 2, 0, 0),
        (16, 32, 4, 2, 0, 0), (16, 64, 4, 3, 0, 0),
        (32, 16, 4, 2, 0, 1), (32, 32, 4, 2, 0, 1), (64, 32, 8, 2, 0, 1), (64, 64, 8, 2, 0, 1),
    ]:  # fmt: skip
        out.append({"block_h": block_h, "block_n": block_n, "num_warps": warps,
                    "num_stages": stages, "q_reload": reload,
                    "tokens_on_m": tokens_on_m, "tma": 0})  # fmt: skip
    # whole tiles by TMA (rows on M; pointer loads where the GPU or the page size rule it out)
    for block_h, block_n, warps, stages in [(64, 64, 8, 2), (64, 64, 8, 3), (16, 32, 4, 2)]:
        out.append({"block_h": block_h, "block_n": block_n, "num_warps": warps,
                    "num_stages": stages, "q_reload": 0, "tokens_on_m": 0,
                    "tma": 1})  # fmt: skip
    return out


def sweep_case(heads: int, q_len: int, fp8: bool, args: argparse.Namespace, bounds: dict) -> Row:
    """Time the Triton decode kernel directly with each sweep config (x a few split counts)."""
    from tokenspeed.mla import triton_decode
    from tokenspeed.mla.configs import plan_decode

    inp = _decode_inputs(heads, q_len, fp8, 0)
    out = torch.empty(DECODE_BATCH, q_len, heads, RANK, dtype=torch.bfloat16, device="cuda")
    scale = 1 / math.sqrt(192)
    elem = 1 if fp8 else 2
    deadline = time.monotonic() + args.sweep_seconds
    tried: list[Row] = []
    for cfg in sweep_configs():
        base = plan_decode(DECODE_BATCH, q_len, heads, DECODE_KV, PAGE, config=cfg)["num_splits"]
        for splits in sorted({1, base, 2 * base}):
            if time.monotonic() > deadline:
                break
            full = {**cfg, "num_splits": splits}
            plan = plan_decode(DECODE_BATCH, q_len, heads, DECODE_KV, PAGE, config=full)
            if plan["block_h"] != cfg["block_h"]:
                continue
            ws = torch.empty(max(1, plan["workspace_bytes"]), dtype=torch.uint8, device="cuda")

            def call(_: Any, full=full, ws=ws) -> None:
                triton_decode.mla_decode(inp["q"], inp["cache"], inp["tables"], inp["seq"], scale,
                                         out=out, kv_scale=inp["scale"], workspace=ws,
                                         config=full)  # fmt: skip

            try:
                timing, _ = _timing(call, lambda i: None, 1 << 40, max(10, args.replays // 3))
                tried.append({**full, "median_us": timing.median_us})
            except Exception as err:  # out of shared memory / registers: skip the variant
                tried.append({**full, "error": f"{type(err).__name__}: {str(err)[:200]}"})
    ok = [t for t in tried if "median_us" in t]
    if not ok:
        raise RuntimeError(f"no sweep config ran: {tried[:3]}")
    best = min(ok, key=lambda t: t["median_us"])
    return {
        "kernel": "triton_mla_decode" + ("_fp8" if fp8 else ""),
        "best_config": {k: v for k, v in best.items() if k != "median_us"},
        "tried": tried,
        **_decode_metrics(heads, q_len, elem, best["median_us"], bounds),
    }


def _prefill_inputs(tokens: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device="cuda", dtype=torch.bfloat16)

    return {
        "q": randn(tokens, PREFILL_HEADS, PREFILL_QK),
        "k": randn(tokens, PREFILL_HEADS, PREFILL_QK),
        "v": randn(tokens, PREFILL_HEADS, PREFILL_V),
        "cu": torch.tensor([0, tokens], dtype=torch.int32, device="cuda"),
    }


# cuDNN's TFLOP/s per prefill length, filled by the "sdpa_cudnn" case (which runs first).
_CUDNN_TFLOPS: dict[int, float] = {}


def _cudnn_sdpa(inp: dict[str, torch.Tensor], scale: float) -> torch.Tensor:
    """Causal SDPA with the cuDNN backend on ``[1, H, T, D]`` views of the inputs."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (inp[n].transpose(0, 1).unsqueeze(0) for n in ("q", "k", "v"))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)


def _prefill_call(impl: str, inp: dict[str, torch.Tensor], out: torch.Tensor, scale: float):
    """The timed call of ``impl``: "sdpa_cudnn", "mla_prefill" (the registry's choice) or
    "triton:<variant>" (the Triton kernel with ``configs.PREFILL_VARIANTS[variant]``)."""
    from tokenspeed.mla import configs, mla_prefill, triton_prefill

    tokens = inp["q"].shape[0]
    if impl == "sdpa_cudnn":
        return lambda _: _cudnn_sdpa(inp, scale)
    if impl == "mla_prefill":
        fn, extra = mla_prefill, {}
    else:
        fn, extra = triton_prefill.mla_prefill, {"config": configs.PREFILL_VARIANTS[impl[7:]]}

    def call(_: Any) -> None:
        fn(inp["q"], inp["k"], inp["v"], inp["cu"], inp["cu"], softmax_scale=scale, causal=True,
           max_seqlen_q=tokens, max_seqlen_kv=tokens, out=out, **extra)  # fmt: skip

    return call


def prefill_case(tokens: int, impl: str, args: argparse.Namespace, bounds: dict) -> Row:
    """Time causal prefill of one ``tokens``-long request (see ``_prefill_call`` for ``impl``).

    Every non-cuDNN row also reports its max abs difference from cuDNN's output (a wrong
    fast variant must not win) and its TFLOP/s as a fraction of cuDNN's in the same run.
    """
    from tokenspeed.kernels import selection_records

    inp = _prefill_inputs(tokens, 0)
    scale = 1 / math.sqrt(PREFILL_QK)
    out = torch.full((tokens, PREFILL_HEADS, PREFILL_V), float("nan"), dtype=torch.bfloat16,
                     device="cuda")  # fmt: skip
    call = _prefill_call(impl, inp, out, scale)
    row: Row = {"kernel": impl}
    if impl != "sdpa_cudnn":
        call(None)
        ref = _cudnn_sdpa(inp, scale)[0].transpose(0, 1)
        row["max_abs_err_vs_cudnn"] = (out.float() - ref.float()).abs().max().item()
        del ref
    if impl == "mla_prefill":
        row["kernel"] = [r["kernel"] for r in selection_records() if r["op"] == "mla.prefill"][-1]
    elif impl.startswith("triton:"):
        from tokenspeed.mla.configs import PREFILL_VARIANTS

        row["config"] = PREFILL_VARIANTS[impl[7:]]
    timing, _ = _timing(call, lambda i: None, 1 << 40, max(5, args.replays // 5))
    pairs = tokens * (tokens + 1) / 2
    flops = 2.0 * PREFILL_HEADS * pairs * (PREFILL_QK + PREFILL_V)
    tflops = flops / (timing.median_us * 1e-6) / 1e12
    if impl == "sdpa_cudnn":
        _CUDNN_TFLOPS[tokens] = tflops
    elif tokens in _CUDNN_TFLOPS:
        row["vs_cudnn"] = tflops / _CUDNN_TFLOPS[tokens]
    return {
        **row,
        "timing": timing.method,
        "median_us": timing.median_us,
        "flops": flops,
        "tflops": tflops,
        "frac_matmul": tflops / bounds["bf16_tflops"],
    }


def prefill_impls(args: argparse.Namespace) -> list[str]:
    """cuDNN first (the ratios need it), the registry's choice, then each Triton variant."""
    from tokenspeed.mla.configs import PREFILL_VARIANTS

    wanted = args.prefill_variants.split(",") if args.prefill_variants else list(PREFILL_VARIANTS)
    unknown = [v for v in wanted if v and v not in PREFILL_VARIANTS]
    if unknown:
        raise SystemExit(f"unknown prefill variants {unknown}; known: {sorted(PREFILL_VARIANTS)}")
    return ["sdpa_cudnn", "mla_prefill", *(f"triton:{v}" for v in wanted if v)]


def cases(args: argparse.Namespace) -> Iterator[tuple[str, Callable[[dict], Row]]]:
    """(label, run) for every case of this run."""
    heads_list = [16, 64, 128] if args.quick else [16, 32, 64, 128]
    q_lens = [1] if args.quick else [1, 2]
    for fp8 in (False, True):
        for q_len in q_lens:
            for heads in heads_list:
                label = f"decode {'fp8' if fp8 else 'bf16'} h{heads} q{q_len}"
                yield label, lambda b, h=heads, q=q_len, f=fp8: decode_case(h, q, f, args, b)
    for tokens in [8192] if args.quick else [8192, 32768]:
        for impl in prefill_impls(args):
            label = f"prefill causal {tokens // 1024}k {impl}"
            yield label, lambda b, t=tokens, i=impl: prefill_case(t, i, args, b)
    if args.sweep:
        for heads, q_len in [(64, 1), (128, 1), (16, 1), (32, 2)]:
            label = f"sweep decode bf16 h{heads} q{q_len}"
            yield label, lambda b, h=heads, q=q_len: sweep_case(h, q, False, args, b)


def compiled_kernel_stats() -> list[dict[str, Any]]:
    """Registers, spills, shared memory and MMA flavour of every compiled MLA Triton kernel.

    Best effort (Triton's cache layout changes between versions): tells whether the decode
    kernel got Hopper ``wgmma`` or fell back to ``mma.sync``, and whether it spills.
    """
    import importlib

    stats: list[dict[str, Any]] = []
    for module, name in (("triton_decode", "_mla_decode_split_kernel"),
                         ("triton_decode", "_mla_decode_split_kernel_tma"),
                         ("triton_prefill", "_mla_prefill_kernel")):  # fmt: skip
        try:
            fn = getattr(importlib.import_module(f"tokenspeed.mla.{module}"), name)
            for caches in fn.device_caches.values():
                for compiled in caches[0].values():
                    ptx = compiled.asm.get("ptx", "")
                    meta = compiled.metadata
                    consts = {k: v for k, v in getattr(meta, "constants", {}).items()
                              if isinstance(v, (int, bool, str))}  # fmt: skip
                    compiled._init_handles()
                    stats.append({
                        "kernel": name,
                        "num_warps": getattr(meta, "num_warps", None),
                        "num_stages": getattr(meta, "num_stages", None),
                        "shared_bytes": getattr(meta, "shared", None),
                        "n_regs": getattr(compiled, "n_regs", None),
                        "n_spills": getattr(compiled, "n_spills", None),
                        "wgmma": "wgmma" in ptx,
                        "mma_sync": "mma.sync" in ptx,
                        "constants": {str(k): v for k, v in consts.items()},
                    })  # fmt: skip
        except Exception as err:  # diagnostics only
            stats.append({"kernel": name, "error": f"{type(err).__name__}: {err}"})
    return stats


def environment() -> dict[str, Any]:
    """Device and library versions of this run."""
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


def _kernel_cell(r: Row) -> str:
    """The kernel name, with the ratio to cuDNN on prefill rows."""
    ratio = r.get("vs_cudnn")
    return r.get("kernel", "") + ("" if ratio is None else f" ({ratio:.2f}x cuDNN)")


def render(rows: list[Row], bounds: dict[str, float]) -> None:
    """Print the results as a rich table."""
    from rich.console import Console
    from rich.table import Table

    title = (
        f"TokenSpeed MLA kernels  (copy {bounds['copy_gbps']:.0f} GB/s, "
        f"bf16 matmul {bounds['bf16_tflops']:.0f} TFLOP/s)"
    )
    table = Table(title=title)
    for col in ("case", "kernel", "splits", "latency us", "GB/s", "% copy", "TFLOP/s", "% mm"):
        table.add_column(col, overflow="fold")

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    def num(v: float | None, f: str) -> str:
        return "-" if v is None else format(v, f)

    for r in rows:
        if "error" in r:
            table.add_row(r["case"], "[red]error[/]", "", r["error"][:80], "", "", "", "")
            continue
        table.add_row(
            r["case"], _kernel_cell(r), str(r.get("num_splits", r.get("best_config", ""))),
            num(r.get("median_us"), ".1f"), num(r.get("gbps"), ".0f"), pct(r.get("frac_copy_bw")),
            num(r.get("tflops"), ".1f"), pct(r.get("frac_matmul")),
        )  # fmt: skip
    Console(width=max(Console().width, 160)).print(table)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit status 1 if any case failed, 2 without a CUDA device."""
    parser = argparse.ArgumentParser(prog="python -m tokenspeed.mla.bench", description=__doc__)
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    parser.add_argument("--quick", action="store_true", help="fewer cases (smoke run)")
    parser.add_argument("--replays", type=int, default=30, help="CUDA-graph replays (median)")
    parser.add_argument("--sweep", action="store_true", help="also sweep decode launch configs")
    parser.add_argument("--only", default="", help="run only cases whose label starts so")
    parser.add_argument("--sweep-seconds", type=float, default=60.0, help="budget per sweep shape")
    parser.add_argument("--prefill-variants", default="",
                        help="comma list of configs.PREFILL_VARIANTS to time (default: all)")  # fmt: skip
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("tokenspeed.mla.bench: needs a CUDA device", file=sys.stderr)
        return 2
    import tokenspeed.mla  # noqa: F401  (registers the kernels)
    from tokenspeed.kernels import selection_records
    from tokenspeed.kernels.timing import device_roofline

    bounds = device_roofline()
    print(f"copy {bounds['copy_gbps']:.0f} GB/s, bf16 matmul {bounds['bf16_tflops']:.0f} TFLOP/s")
    rows: list[Row] = []
    failed = 0
    for label, run in cases(args):
        if not label.startswith(args.only):
            continue
        try:
            row = {"case": label, **run(bounds)}
        except Exception as err:  # one broken case must not lose the others
            failed += 1
            row = {"case": label, "error": f"{type(err).__name__}: {err}",
                   "traceback": traceback.format_exc()}  # fmt: skip
        print(json.dumps({k: v for k, v in row.items() if k not in ("traceback", "tried")}))
        sys.stdout.flush()
        rows.append(row)
        torch.cuda.empty_cache()
    render(rows, bounds)
    kernels = compiled_kernel_stats()
    for k in kernels:
        print("compiled:", json.dumps({key: v for key, v in k.items() if key != "constants"}))
    report = {
        "benchmark": "mla",
        "environment": environment(),
        "bounds": bounds,
        "results": rows,
        "selections": selection_records(),
        "compiled_kernels": kernels,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out} ({len(rows) - failed}/{len(rows)} cases ok)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
