"""MLA decode variants at FlashMLA's shapes, timed in one run against the measured bounds.

    python3 benchmarks/mla/sweep_decode.py --out FILE [--heads 16,32,64,128] [--q-lens 1,2]

Batch 128 (``--batch``), KV length 4096, page 64, bf16 query and cache. For every shape it times the
registry's choice, the Triton kernel's default launch, and CuTe DSL SM90 variants (split
count, pipelining) when ``nvidia-cutlass-dsl`` is
installed, checks each against the first variant's output once (bf16 tolerance), and reports
latency, bandwidth (fraction of the device copy measured in the same run) and TFLOP/s
(fraction of the bf16 matmul rate). A variant that fails to compile or disagrees is reported
and skipped. Bytes and FLOPs as in ``tokenspeed.mla.bench``.

``--rounds N`` times every passing variant N times, in rounds that alternate the order, and
reports the median of the rounds (with their spread): two readings of one configuration in a
single pass differed by 7 % at 128 heads on the H200 (docs/mla-experiments.md), more than most
differences between variants. Each variant after a shape's first is also reported as its ratio to
the first, round by round (median and range: ``x0.987 (0.928-1.000)``); a change is only a change
where that range stays on one side of 1.

``--interleave N`` times the passing variants together instead: N replays, each running every
variant once back to back (``kernels.timing.time_gpu_interleaved``), so sample ``r`` of every
variant is taken under the same clocks and temperature; the median sample and the ratio to the
first variant replay by replay are reported with their interquartile range (``x0.987 (iqr
0.981-0.993)``). Rounds are timed a few milliseconds apart each and drift between them
(identical kernels read 3.6 % apart, round 1 faster than the rest in every shape).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

BATCH, KV_LEN, PAGE, RANK, ROPE = 128, 4096, 64, 512, 64
SCALE = 1 / math.sqrt(192)


def _inputs(heads: int, q_len: int, seed: int = 0, fp8: str = "") -> dict[str, Any]:
    """bf16 cache, or (``fp8`` "tensor" / "token") e4m3 with one scale or one per token."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    pages_per = KV_LEN // PAGE
    perm = torch.randperm(BATCH * pages_per, generator=gen, device="cuda").to(torch.int32)
    cache = torch.randn(BATCH * pages_per, PAGE, RANK + ROPE, generator=gen, device="cuda")
    q = torch.randn(BATCH, q_len, heads, RANK + ROPE, generator=gen, device="cuda")
    cache, scale = cache.mul_(0.5).bfloat16(), None
    if fp8 == "tensor":
        scale = torch.tensor([0.5 * 4.5 / 448], device="cuda")
        cache = (cache.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    elif fp8 == "token":
        scale = cache.float().abs().amax(-1) / 448
        cache = (cache.float() / scale[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return {
        "q": q.bfloat16(),
        "cache": cache,
        "scale": scale,
        "tables": perm.view(BATCH, pages_per),
        "seq": torch.full((BATCH,), KV_LEN, dtype=torch.int32, device="cuda"),
    }


TRITON_CONFIGS: list[dict[str, Any]] = []  # --triton-configs: launches of the Triton decode


def triton_config_name(cfg: dict[str, Any]) -> str:
    """A Triton decode launch as a variant name: ``triton bh64 bn32 w8 s3 tokens``."""
    short = {"block_h": "bh", "block_n": "bn", "num_warps": "w", "num_stages": "s",
             "num_splits": "x", "q_reload": "qr"}  # fmt: skip
    parts = [f"{short[k]}{v}" for k, v in cfg.items() if k in short]
    if cfg.get("tokens_on_m"):
        parts.append("tokens")
    if cfg.get("tma"):
        parts.append("tma")
    return " ".join(["triton", *parts])


def variants(
    heads: int, q_len: int, only: set[str] | None = None, fp8: bool = False
) -> list[tuple[str, Callable[..., Any]]]:
    """(name, call(q, cache, scale, tables, seq, out)) for every variant worth timing at a
    shape (those named in ``only``, when given; the first one is the others' reference)."""
    from tokenspeed.mla import mla_decode, triton_decode

    out: list[tuple[str, Callable[..., Any]]] = [
        ("triton default", lambda q, c, k, t, s, o: triton_decode.mla_decode(
            q, c, t, s, SCALE, out=o, kv_scale=k, max_seq_len=KV_LEN)),
        ("registry", lambda q, c, k, t, s, o: mla_decode(q, c, t, s, SCALE, out=o,
                                                         kv_scale=k, max_seq_len=KV_LEN)),
    ]  # fmt: skip
    for cfg in TRITON_CONFIGS:
        if int(cfg.get("block_h", 0)) > heads * q_len:
            continue  # the plan would shrink the block: the same launch as a smaller one
        out.append((triton_config_name(cfg), lambda q, c, k, t, s, o, cfg=cfg:
                    triton_decode.mla_decode(q, c, t, s, SCALE, out=o, kv_scale=k,
                                             max_seq_len=KV_LEN, config=cfg)))  # fmt: skip
    if importlib.util.find_spec("cutlass") is not None and fp8:
        from tokenspeed.mla import cute_decode

        rings: dict[str, dict[str, Any]] = {}
        # 16-32 rows widened in the consumers' registers (cute_decode_fp8_regs.py): four FP8
        # slots (the plan's), three or five, and the ring filled from L2
        regs = {"layout": "regs"}
        rings["regs"] = regs
        for slots in (3, 5):  # the plan's is 4
            rings[f"regs {slots}"] = {**regs, "fp8_stages": slots}
        rings["regs ablation l2_loads"] = {**regs, "ablation": "l2_loads"}
        # the running max kept while no score of a tile passes it by more than the slack (the
        # plan's is 4; 0 exchanges the maxima and rescales on every tile)
        for slack in (0, 4, 8):
            rings[f"regs slack{slack}"] = {**regs, "max_slack": slack}
            rings[f"regs slack{slack} ablation l2_loads"] = {**regs, "max_slack": slack,
                                                              "ablation": "l2_loads"}  # fmt: skip
        # 64 rows widened in registers (cute_decode_fp8_regs64.py): scoring in turns, the
        # values split by output dims between the groups
        regs64 = {"layout": "regs", "rows": 64}
        rings["regs64"] = regs64
        rings["regs64 slack0"] = {**regs64, "max_slack": 0}
        rings["regs64 slack8"] = {**regs64, "max_slack": 8}
        rings["regs64 2 slots"] = {**regs64, "fp8_stages": 2}
        # the block-table entries read after the loader's slot wait, not before (the default)
        rings["regs late_pages"] = {**regs, "page_prefetch": 0}
        rings["regs64 late_pages"] = {**regs64, "page_prefetch": 0}
        rings["regs64 ablation l2_loads"] = {**regs64, "ablation": "l2_loads"}
        for ring, cfg in rings.items():
            out.append((
                f"cute fp8 ring {ring}",
                lambda q, c, k, t, s, o, cfg=cfg: cute_decode.mla_decode(
                    q, c, t, s, SCALE, out=o, kv_scale=k, max_seq_len=KV_LEN, config=cfg),
            ))  # fmt: skip
    elif importlib.util.find_spec("cutlass") is not None:
        from tokenspeed.mla import cute_decode

        rows = heads * q_len
        configs: list[tuple[str, dict[str, Any]]] = [("cute", {}), ("cute x2", {"num_splits": 2})]
        # the layouts and rings the plan did not pick, to keep its choice honest
        if rows <= 32:
            configs.append(("cute pairs", {"layout": "pairs"}))
            configs.append(("cute tokens 2 groups", {"layout": "tokens", "wgs": 2}))
        else:
            configs.append(("cute tokens", {"layout": "tokens"}))
            configs.append(("cute pairs", {"layout": "pairs"}))  # the default, named
            # the pairs kernel's tiles: 64 tokens (a ring of one pair) or 32 (a ring of two),
            # O rescaled by every thread or only where a row's max moved ("lazy"); the stage
            # in halves, or with the rope blocks released once scored ("rope")
            pairs = {"layout": "pairs", "rope_early": 0}
            configs += [
                ("cute pairs t64", {**pairs, "tile": 64, "lazy_rescale": 0}),
                ("cute pairs t64 lazy", {**pairs, "tile": 64, "lazy_rescale": 1}),
                ("cute pairs t32", {**pairs, "tile": 32, "lazy_rescale": 0}),
                ("cute pairs t32 lazy", {**pairs, "tile": 32, "lazy_rescale": 1}),
                ("cute pairs t64 rope", {**pairs, "tile": 64, "lazy_rescale": 0, "rope_early": 1}),
            ]
        configs += [("cute plain loads", {"evict_first": 0})]  # no L2 evict-first hint
        # block-table entries read when a stage frees, not a tile ahead (the code until
        # 2026-12-02)
        configs += [("cute no page prefetch", {"page_prefetch": 0})]
        # leaving products out or loading from L2 (benchmark-only); the pairs kernel, the
        # default from 64 rows, has only the L2 one (the tokens kernel all four)
        ablations = (
            ("no_values", "no_scores", "no_mma", "l2_loads") if rows <= 32 else ("l2_loads",)
        )
        configs += [(f"cute ablation {a}", {"ablation": a}) for a in ablations]
        if rows > 32:
            for name, tiles in (("t64", (64, 0, 0)), ("t32", (32, 0, 0)),
                                ("t32 lazy", (32, 1, 0)), ("t64 rope", (64, 0, 1))):  # fmt: skip
                cfg = {"layout": "pairs", "tile": tiles[0], "lazy_rescale": tiles[1],
                       "rope_early": tiles[2]}  # fmt: skip
                configs.append((f"cute pairs {name} ablation l2_loads",
                                {**cfg, "ablation": "l2_loads"}))  # fmt: skip
        for name, cfg in configs:
            out.append((
                name,
                lambda q, c, k, t, s, o, cfg=cfg: cute_decode.mla_decode(
                    q, c, t, s, SCALE, out=o, max_seq_len=KV_LEN, config=cfg),
            ))  # fmt: skip
    if not fp8 and (only is None or PEER in only):
        out += _peer_variants()
    return [v for v in out if only is None or v[0] in only]


PEER = "flashinfer fa3"


def _peer_variants() -> list[tuple[str, Callable[..., Any]]]:
    """FlashInfer's MLA decode, the peer issue #8 names, where it is installed (bf16 only:
    its SM90 MLA kernel takes no FP8 cache)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from flashinfer_mla import FlashInferMlaDecode, available

    if not available():
        return []
    peer = FlashInferMlaDecode("fa3")
    return [(PEER, lambda q, c, k, t, s, o: peer(q, c, t, s, SCALE, o))]


def _metrics(
    heads: int, q_len: int, us: float, bounds: dict[str, float], fp8: str = ""
) -> dict[str, float]:
    """Bytes as in ``tokenspeed.mla.bench`` (an FP8 cache: one byte per value, plus the
    per-token scales when there are any)."""
    kv_bytes = BATCH * KV_LEN * ((RANK + ROPE) * (1 if fp8 else 2) + (4 if fp8 == "token" else 0))
    io_bytes = BATCH * heads * q_len * (RANK + ROPE + RANK) * 2
    flops = 2.0 * BATCH * heads * q_len * KV_LEN * (RANK + ROPE + RANK)
    gbps = (kv_bytes + io_bytes) / (us * 1e-6) / 1e9
    tflops = flops / (us * 1e-6) / 1e12
    return {
        "median_us": us,
        "gbps": gbps,
        "frac_copy_bw": gbps / bounds["copy_gbps"],
        "tflops": tflops,
        "frac_matmul": tflops / bounds["bf16_tflops"],
    }


def summarise_rounds(round_us: list[float]) -> dict[str, Any]:
    """One variant's readings over the rounds: their median (what the tables report) and
    spread, so a difference between variants can be read against the noise."""
    return {
        "round_us": list(round_us),
        "round_median_us": statistics.median(round_us),
        "round_spread_us": [min(round_us), max(round_us)],
    }


def _quartiles(values: list[float]) -> list[float]:
    """The 25th and 75th percentiles (both the value itself when there is one)."""
    if len(values) < 2:
        return [values[0], values[0]]
    q = statistics.quantiles(values, n=4)
    return [q[0], q[2]]


def paired_ratios(round_us: list[float], base_us: list[float]) -> dict[str, Any]:
    """A variant against the first one timed, round by round: each round times both back to
    back, so the ratio of a round cancels whatever the machine did across rounds. Its median
    and range (and interquartile range, for many readings) say whether a few per cent is a
    difference or the noise (in one pass, two readings of one kernel differed by 7 %)."""
    ratios = [a / b for a, b in zip(round_us, base_us, strict=True)]
    return {
        "ratio_to_first": ratios,
        "ratio_median": statistics.median(ratios),
        "ratio_spread": [min(ratios), max(ratios)],
        "ratio_iqr": _quartiles(ratios),
    }


def summarise_samples(sample_us: list[float]) -> dict[str, Any]:
    """One variant's interleaved samples: their median and interquartile range."""
    return {
        "sample_us": list(sample_us),
        "sample_median_us": statistics.median(sample_us),
        "sample_iqr_us": _quartiles(sample_us),
    }


def sweep_shape(
    heads: int, q_len: int, bounds: dict[str, float], replays: int, only: set[str] | None = None,
    fp8: str = "", rounds: int = 1, interleave: int = 0,
) -> list[dict]:  # fmt: skip
    """Check and time every variant at one shape (``rounds`` times each, or ``interleave``
    replays of all in turn; see the module)."""
    from tokenspeed.kernels.timing import time_gpu, time_gpu_interleaved

    inp = _inputs(heads, q_len, fp8=fp8)
    args = (inp["q"], inp["cache"], inp["scale"], inp["tables"], inp["seq"])
    rows: list[dict] = []
    timed: list[tuple[dict, Callable[[], Any]]] = []  # (row, its timed call) of each that passed
    ref = None
    for name, call in variants(heads, q_len, only, fp8=bool(fp8)):
        row: dict[str, Any] = {"heads": heads, "q_len": q_len, "variant": name,
                               "cache": f"fp8 per {fp8}" if fp8 else "bf16"}  # fmt: skip
        try:
            o = torch.full((BATCH, q_len, heads, RANK), float("nan"), dtype=torch.bfloat16,
                           device="cuda")  # fmt: skip
            t0 = time.monotonic()
            call(*args, o)
            torch.cuda.synchronize()
            row["first_call_s"] = time.monotonic() - t0
            if ref is None:
                ref = o.float()
            err = (o.float() - ref).abs().max().item()
            row["max_abs_err_vs_first"] = err
            if "ablation" in name:
                row["note"] = "ablation: timing only, output wrong by design"
            elif not math.isfinite(err) or err > 3e-2:
                row["error"] = f"disagrees with {rows[0]['variant'] if rows else 'itself'}"
            if "error" not in row:
                run = lambda _, call=call, o=o: call(*args, o)  # noqa: E731
                timing = time_gpu(run, [None], replays=replays)
                row.update(_metrics(heads, q_len, timing.median_us, bounds, fp8))
                timed.append((row, run))
        except Exception as err:  # one broken variant must not lose the others
            row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
            row["traceback"] = traceback.format_exc()[-2000:]
        print(json.dumps({k: v for k, v in row.items() if k != "traceback"}), flush=True)
        rows.append(row)
    if interleave and timed:
        samples = time_gpu_interleaved(
            [lambda run=run: run(None) for _, run in timed], replays=interleave
        )
        for i, (row, _) in enumerate(timed):
            row.update(summarise_samples(samples[i]))
            if i:
                row.update(paired_ratios(samples[i], samples[0]))
            row.update(_metrics(heads, q_len, row["sample_median_us"], bounds, fp8))
    elif rounds > 1 and timed:
        readings = {id(row): [row["median_us"]] for row, _ in timed}
        for r in range(1, rounds):
            for row, run in timed[::-1] if r % 2 else timed:
                readings[id(row)].append(time_gpu(run, [None], replays=replays).median_us)
        base = readings[id(timed[0][0])]
        for i, (row, _) in enumerate(timed):
            row.update(summarise_rounds(readings[id(row)]))
            if i:
                row.update(paired_ratios(readings[id(row)], base))
            row.update(_metrics(heads, q_len, row["round_median_us"], bounds, fp8))
            print(json.dumps({k: row[k] for k in ("heads", "q_len", "variant", "round_us")}),
                  flush=True)  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    """Sweep and print a table; JSON to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--heads", default="16,32,64,128")
    parser.add_argument("--q-lens", default="1")
    parser.add_argument(
        "--batch",
        type=int,
        default=128,
        help="requests of KV_LEN tokens (132 = one CTA per H200 SM at 64 heads: what the grid's "
        "four idle SMs cost)",
    )
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument(
        "--rounds", type=int, default=1, help="time each variant this many times, interleaved"
    )
    parser.add_argument(
        "--interleave",
        type=int,
        default=0,
        help="time the variants together: this many replays of all in turn (see the module)",
    )
    parser.add_argument(
        "--fp8",
        choices=("tensor", "token"),
        default="",
        help="an FP8 cache with one scale per tensor or per token",
    )
    parser.add_argument(
        "--variants", default=None, help="comma-separated variant names to time (default: all)"
    )
    parser.add_argument(
        "--triton-configs",
        default=None,
        help="a JSON list of Triton decode launch configs (inline or a file) timed as variants "
        "'triton bh.. bn.. w.. s..' beside the others",
    )
    args = parser.parse_args(argv)
    global BATCH
    BATCH = args.batch
    if args.triton_configs:
        text = args.triton_configs
        if not text.lstrip().startswith("["):
            text = Path(text).read_text()
        TRITON_CONFIGS[:] = json.loads(text)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    import tokenspeed.mla  # noqa: F401  (registers the kernels)
    from tokenspeed.kernels.timing import device_roofline

    bounds = device_roofline()
    print(f"copy {bounds['copy_gbps']:.0f} GB/s, read {bounds['read_gbps']:.0f} GB/s, "
          f"bf16 matmul {bounds['bf16_tflops']:.0f} TFLOP/s")  # fmt: skip
    results: list[dict] = []
    for q_len in (int(x) for x in args.q_lens.split(",")):
        for heads in (int(x) for x in args.heads.split(",")):
            only = set(args.variants.split(",")) if args.variants else None
            if only is not None:  # the configs asked for are timed whatever --variants says
                only |= {triton_config_name(c) for c in TRITON_CONFIGS}
            results += sweep_shape(heads, q_len, bounds, args.replays, only, args.fp8,
                                   max(1, args.rounds), max(0, args.interleave))  # fmt: skip
            torch.cuda.empty_cache()
    print(f"\n{'shape':<10} {'variant':<36} {'us':>8} {'% copy':>7} {'TFLOP/s':>8} {'% mm':>6}")
    for r in results:
        shape = f"h{r['heads']} q{r['q_len']}"
        if "median_us" not in r:
            print(f"{shape:<10} {r['variant']:<36} {r.get('error', '')[:60]}")
            continue
        spread = ""
        if "sample_iqr_us" in r:  # interleaved: quartiles of the samples and of the ratios
            lo, hi = r["sample_iqr_us"]
            spread = f"  samples {lo:.1f}-{hi:.1f}"
            if "ratio_median" in r:
                a, b = r["ratio_iqr"]
                spread += f"  x{r['ratio_median']:.3f} (iqr {a:.3f}-{b:.3f})"
        elif "round_spread_us" in r:
            lo, hi = r["round_spread_us"]
            spread = f"  rounds {lo:.1f}-{hi:.1f}"
            if "ratio_median" in r:  # against the shape's first variant, round by round
                a, b = r["ratio_spread"]
                spread += f"  x{r['ratio_median']:.3f} ({a:.3f}-{b:.3f})"
        print(f"{shape:<10} {r['variant']:<36} {r['median_us']:>8.1f} "
              f"{100 * r['frac_copy_bw']:>6.1f}% {r['tflops']:>8.1f} "
              f"{100 * r['frac_matmul']:>5.1f}%{spread}")  # fmt: skip
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps({"bounds": bounds, "batch": BATCH, "results": results}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
