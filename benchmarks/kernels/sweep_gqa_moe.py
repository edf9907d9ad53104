"""One H200 run for issue #7's two missed targets: paged GQA decode and small-batch fused MoE.

Targets: decode at Llama-3-8B shapes (32/8 heads, head dim 128, bf16, pages of 16 and 64;
64 x 2k and 16 x 8k tokens) at >= 95% of the measured copy bandwidth (bytes = K+V read + q +
out); fused MoE at Qwen3-30B-A3B shapes (hidden 2048, 128 experts, top-8, intermediate 768,
bf16; 1-256 tokens) at >= 75% of the weight-read bound (bytes = the selected experts'
weights + x + out).

The run (a) measures the copy bandwidth and the bf16 matmul rate
(``kernels/timing.py:device_roofline``), (b) checks every variant once against the torch
reference (bf16 tolerance) and times the ones that pass by CUDA-graph replay over rotating
inputs larger than L2 (median), (c) prints a table and writes JSON. A variant that fails to
compile, raises, or is wrong is recorded and skipped; variants run in priority order (most
promising first) and stop at ``--budget-s`` so the run stays bounded. Each result carries the
compiled kernels' registers, spills and shared memory.

    python3 benchmarks/kernels/sweep_gqa_moe.py --out sweep.json [--quick] [--only decode]
    python3 benchmarks/kernels/sweep_gqa_moe.py --dry-run      # the plan, no GPU needed
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

Config = dict[str, Any]
HEADS = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128}
DECODE_SHAPES = ((64, 2048), (16, 8192))
DECODE_PAGES = (16, 64)
# "shuffled": each request's pages at random places in the pool (what a serving pool looks
# like); "sequential": in order, so a request's cache is contiguous (``--page-order``), which
# separates what scattered pages cost from what a page's size costs.
DECODE_INPUTS = {"page_order": "shuffled"}
# ``w2_order``: "k" stores each expert's down projection [H, I] (the checkpoints' layout), "n"
# stores it [I, H] and passes the [H, I] view (what the one-pass kernel needs); ``--w2-order``.
MOE = {"hidden": 2048, "intermediate": 768, "num_experts": 128, "top_k": 8, "w2_order": "k"}
MOE_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MOE_TOKENS_QUICK = (1, 4, 16, 64, 256)
TARGETS = {"decode": 0.95, "moe": 0.75}
H200_SMS = 132  # planning without a GPU (--dry-run)
# Where and in what dtype the workloads live; the unit test of this script's plumbing runs it
# on CPU in float32 under the Triton interpreter with tiny shapes.
DEVICE = "cuda"
DTYPE = torch.bfloat16


@dataclass(frozen=True)
class Case:
    """One (op, shape, variant) to check and time; ``config`` goes to the Triton kernel."""

    op: str  # "decode" or "moe"
    shape: tuple[tuple[str, Any], ...]
    variant: str
    config: Config = field(hash=False, compare=False)

    @property
    def dims(self) -> dict[str, Any]:
        return dict(self.shape)

    @property
    def label(self) -> str:
        d = self.dims
        if self.op == "decode":
            order = "" if DECODE_INPUTS["page_order"] == "shuffled" else " seq"
            return f"decode b={d['batch']} kv={d['kv_len']} page={d['page_size']}{order}"
        order = "" if MOE["w2_order"] == "k" else f" w2={MOE['w2_order']}"
        return f"moe tokens={d['tokens']}{order}"


# -- decode variants -------------------------------------------------------------------------
# The registry default first (since 2026-12-01 the winners of the previous run), then the
# runners-up it was chosen over and the previous default, so each run shows the margins.
# Resident CTAs per SM decide how many programs one wave holds (sm_90a, Triton 3.6, registers
# and shared memory of the compiled kernels; the run records them next to each result): page
# 16 n64 s2 95 registers, 39 KB (5 per SM); page-block n64 s2 143 registers with one split, so
# ``maxnreg`` 128 pins 4 per SM; n32 s3 with carried page ids 80-104 registers, 38 KB (4); TMA
# n64 s2 121-125 registers, 55 KB (4).


def _decode_traits(d: dict[str, Any]) -> dict[str, Any]:
    return {"batch": d["batch"], "num_kv_heads": HEADS["num_kv_heads"], "kv_len": d["kv_len"],
            "head_dim": HEADS["head_dim"], "page_size": d["page_size"]}  # fmt: skip


def _wave(d: dict[str, Any], sms: int, ctas: int, block_n: int = 64, fused: bool = True,
          **cfg: Any) -> Config:  # fmt: skip
    """A split-grid config whose programs fit in one wave of ``ctas`` per SM where they can."""
    from tokenspeed.kernels.triton_ops.configs import decode_wave_splits

    splits = decode_wave_splits(_decode_traits(d), ctas, sms, block_n)
    base = {"block_n": block_n, "num_warps": 4, "num_stages": 2, "num_splits": splits}
    return {**base, **({"merge": "fused"} if splits > 1 and fused else {}), **cfg}


Variant = tuple[str, Config | None, bool]  # label, config (None: n/a), part of --quick


def _decode_variants(d: dict[str, Any], sms: int) -> Iterator[Variant]:
    """Variants in priority order (the registry default first)."""
    from tokenspeed.kernels.triton_ops import configs

    traits = _decode_traits(d)
    p16 = d["page_size"] % 64 != 0
    default = configs.decode_default_config(traits, sms)
    yield "default", default, True
    # Programmatic dependent launch between back-to-back calls (pdl.py): the next call's
    # programs are resident when this one ends.
    yield "default-pdl-early", {**default, "pdl": "early"}, False
    yield "default-pdl-exit", {**default, "pdl": "exit"}, False
    # The same plan with the second merge launch instead of the last-arriving split's merge.
    merged = {k: v for k, v in default.items() if k != "merge"}
    yield "default-merge-kernel", merged if default.get("merge") else None, False
    # Pointer loads, 64-token tiles, one wave (page 64: capped at 128 registers, 4 per SM).
    yield "wave", _wave(d, sms, 5, fused=False) if p16 else _wave(
        d, sms, 4, fused=False, maxnreg=128), True  # fmt: skip
    yield "n32-carry-s3", _wave(d, sms, 4, 32, num_stages=3, carry_pages=True), True
    if not p16:
        yield "tma-n64-s2", _wave(d, sms, 4, tma=True), True
    else:
        yield from _few_split_variants(d)
    # The default before 2026-12-01: about 4 programs per SM, merge launch.
    previous = {"block_n": 64, "num_warps": 4, "num_stages": 2,
                "num_splits": configs.decode_num_splits(traits, sms)}  # fmt: skip
    yield "previous-default", previous, False
    yield from _cute_decode_variants(traits, sms)
    yield from _peer_decode_variants()


def _peer_decode_variants() -> Iterator[Variant]:
    """FlashInfer's decode, the peer issue #7 names, where it is installed: on CUDA cores, and
    on tensor cores through its FlashAttention-2 and (Hopper) -3 prefill kernels."""
    if DEVICE != "cuda":
        return
    from flashinfer_gqa import available

    if not available():
        return
    yield "flashinfer", {"kernel": "flashinfer", "tensor_cores": False}, False
    yield "flashinfer-tc", {"kernel": "flashinfer", "tensor_cores": True, "backend": "fa2"}, False
    yield "flashinfer-fa3", {"kernel": "flashinfer", "tensor_cores": True, "backend": "fa3"}, False


def _cute_decode_variants(traits: dict[str, Any], sms: int) -> Iterator[Variant]:
    """The CuTe DSL SM90 decode (``kernel: "cute"``), where it can run: its plan, then one and
    two CTAs per (request, KV head) at 2-6 stages, and without the L2 evict-first hint."""
    if not _cute_available():
        return
    from tokenspeed.kernels.cute_ops.configs import gqa_decode_default_config

    plan = gqa_decode_default_config(traits, sms)
    yield "cute", {"kernel": "cute", **plan}, True
    for cluster, stages in ((1, 3), (2, 3), (1, 6), (2, 2), (2, 4), (1, 2), (3, 2), (3, 3), (4, 2)):
        cfg = {"kernel": "cute", "cluster": cluster, "stages": stages, "evict_first": True}
        yield f"cute-c{cluster}-s{stages}", cfg, False
    yield "cute-plain-loads", {"kernel": "cute", **plan, "evict_first": False}, False
    # Tiles laid out [token][64-dim block][...]: two TMA copies per page block, not one.
    yield "cute-2d-boxes", {"kernel": "cute", **plan, "box": 0}, False
    yield "cute-c1-s3-2d-boxes", {"kernel": "cute", "cluster": 1, "stages": 3, "box": 0}, False


def _cute_available() -> bool:
    """CuTe DSL importable and an SM90 GPU present (the kernel's registry capability)."""
    import importlib.util

    return (DEVICE == "cuda" and torch.cuda.is_available()
            and torch.cuda.get_device_capability(0) == (9, 0)
            and importlib.util.find_spec("cutlass") is not None)  # fmt: skip


def _few_split_variants(d: dict[str, Any]) -> Iterator[Variant]:
    """Page 16 at 16 x 8k: one or two splits, so fewer (or no) partials to merge at the end.

    With four splits and the fused merge every program publishes its partial with a release
    atomic and the last one merges, a tail of a few microseconds in a ~135 us call. One
    split is 128 programs (one per SM, four SMs idle), each streaming 4 MB, so it needs
    many bytes in flight per program: deeper pipelines and wider tiles.
    """
    if d["batch"] * HEADS["num_kv_heads"] * 4 > 1024:
        return
    shapes = {1: ((128, 3, 8), (128, 2, 8), (128, 3, 4), (128, 2, 4), (64, 5, 8), (64, 6, 8),
                  (256, 2, 8), (128, 3, 16)),
              2: ((64, 3, 4), (128, 2, 8))}  # fmt: skip
    for splits, tiles in shapes.items():
        for n, stages, warps in tiles:
            for carry in (True, False) if (splits, n, stages, warps) == (1, 128, 3, 8) else (True,):
                cfg = {"block_n": n, "num_stages": stages, "num_warps": warps,
                       "num_splits": splits, "carry_pages": carry,
                       **({"merge": "fused"} if splits > 1 else {})}  # fmt: skip
                tag = "" if carry else "-nocarry"
                yield f"split{splits}-n{n}-s{stages}-w{warps}{tag}", cfg, True


# -- MoE variants ----------------------------------------------------------------------------

# The defaults before 2026-12-01 (sorted path, torch alignment and top-k sum).
PREVIOUS_MOE_SMALL = {"block_m": 16, "block_n": 32, "block_k": 128, "num_warps": 4,
                      "num_stages": 4, "down_block_n": 64, "down_block_k": 128}  # fmt: skip
PREVIOUS_MOE = {"block_m": 16, "block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 3}


def _moe_variants(tokens: int) -> Iterator[Variant]:
    from tokenspeed.kernels.triton_ops.configs import moe_default_config

    default = moe_default_config({
        "num_tokens": tokens, "top_k": MOE["top_k"], "num_experts": MOE["num_experts"],
        "hidden": MOE["hidden"],
        "w2_contiguous": "hidden" if MOE["w2_order"] == "n" else "intermediate",
    })  # fmt: skip
    previous = PREVIOUS_MOE_SMALL if tokens * MOE["top_k"] <= 64 else PREVIOUS_MOE
    fewer = {"align": "triton", "reduce": "triton"}
    yield "default", default, True
    if default.get("path") == "onepass":
        # Programmatic dependent launch is this path's default (pdl.py): without it, and
        # with the next call let in only when every program has exited.
        yield "default-no-pdl", {**default, "pdl": ""}, False
        # The other warp count, and (one token) the down rows summed per item, not per row.
        other_warps = 8 if default["num_warps"] == 4 else 4
        yield f"default-w{other_warps}", {**default, "num_warps": other_warps}, False
        yield "default-no-row-acc", {**default, "row_acc": 0}, False
        yield "default-pdl-exit", {**default, "pdl": "exit"}, False
        # Benchmark-only ablations (wrong outputs, timed anyway): no workspace sums or
        # last-arrival step; the weights summed instead of multiplied.
        yield "ablation-no-tail", {**default, "ablation": "no_tail"}, False
        yield "ablation-loads-only", {**default, "ablation": "loads_only"}, False
    # The sorted path with one-launch alignment and top-k sum (the default from 32 tokens).
    yield "fewer-launches", {**previous, **fewer}, True
    if tokens <= 8:
        # Gate/up n32 k128 s4; token-major down n16 k256 s4 (the default at 1-8 tokens).
        yield "sortfree-token-n32", {"path": "sortfree", "down": "token", "block_m": 16,
                                     "block_n": 32, "block_k": 128, "num_warps": 4,
                                     "num_stages": 4, "down_block_n": 16, "down_block_k": 256,
                                     "down_num_warps": 4, "down_num_stages": 4}, True  # fmt: skip
        # The same with six stages in the token-major down (the parts grid's best down launch).
        yield "sortfree-token-n32-down-s6", {"path": "sortfree", "down": "token",
                                             "block_m": 16, "block_n": 32, "block_k": 128,
                                             "num_warps": 4, "num_stages": 4,
                                             "down_block_n": 16, "down_block_k": 256,
                                             "down_num_warps": 4, "down_num_stages": 6}, True  # fmt: skip
    if tokens <= 8 and MOE["w2_order"] == "n":
        # One launch over both projections (needs w2 stored [I, H]); intermediate rows per step,
        # stages, warps, programs per SM.
        for rows, stages, warps, per_sm in (
            (4, 3, 8, 1),
            (4, 4, 8, 1),
            (4, 2, 8, 1),
            (4, 3, 16, 1),
            (2, 6, 8, 1),
            (2, 3, 4, 2),
            (4, 3, 4, 1),
        ):
            yield (f"onepass-i{rows}-s{stages}-w{warps}-p{per_sm}",
                   {"path": "onepass", "block_i": rows, "num_stages": stages,
                    "num_warps": warps, "programs": per_sm * H200_SMS}, True)  # fmt: skip
        yield "onepass-i4-s3-w8-p1-evict", {"path": "onepass", "block_i": 4, "num_stages": 3,
                                            "num_warps": 8, "programs": H200_SMS,
                                            "evict_first": 1}, True  # fmt: skip
        yield "onepass-i4-s3-w8-g128", {"path": "onepass", "block_i": 4, "num_stages": 3,
                                        "num_warps": 8, "programs": 128}, True  # fmt: skip
    if tokens <= 32:
        yield "sortfree-expert", {"path": "sortfree", "reduce": "triton", "block_m": 16,
                                  "block_n": 16 if tokens <= 4 else 32, "block_k": 128,
                                  "num_warps": 4, "num_stages": 4, "down_block_n": 32,
                                  "down_block_k": 128}, False  # fmt: skip
    if tokens >= 64:
        yield "m32-n64-k64", {"block_m": 32, "block_n": 64, "block_k": 64, "num_warps": 4,
                              "num_stages": 3, **fewer}, False  # fmt: skip
    yield "previous-default", previous, False


# -- the plan --------------------------------------------------------------------------------


def plan(only: str | None, quick: bool, sms: int, variants: set[str] | None = None) -> list[Case]:
    """Every case, variant-major (all shapes of the first variant, then the next...), so a
    run that hits its budget loses the least promising variants everywhere. ``variants``
    keeps only those labels."""
    per_shape: list[list[Case]] = []
    if only in (None, "decode"):
        for batch, kv_len in DECODE_SHAPES:
            for page in DECODE_PAGES:
                d = {"batch": batch, "kv_len": kv_len, "page_size": page}
                per_shape.append(_cases("decode", d, _decode_variants(d, sms), quick))
    if only in (None, "moe"):
        for tokens in MOE_TOKENS_QUICK if quick else MOE_TOKENS:
            per_shape.append(_cases("moe", {"tokens": tokens}, _moe_variants(tokens), quick))
    if variants:
        per_shape = [[c for c in cases if c.variant in variants] for cases in per_shape]
    out: list[Case] = []
    for rank in range(max((len(c) for c in per_shape), default=0)):
        out += [cases[rank] for cases in per_shape if rank < len(cases)]
    return out


def _cases(op: str, d: dict[str, Any], variants: Iterator[Variant], quick: bool) -> list[Case]:
    """Variants of one shape (only the ``--quick`` ones when asked), identical configs
    dropped (the first label kept)."""
    seen: list[Config] = []
    cases = []
    for label, cfg, in_quick in variants:
        if cfg is None or (quick and not in_quick) or cfg in seen:
            continue
        seen.append(cfg)
        cases.append(Case(op, tuple(sorted(d.items())), label, cfg))
    return cases


# -- inputs, reference, bytes ----------------------------------------------------------------


@dataclass
class Workload:
    """Rotating input sets of one shape, the reference output of set 0, bytes per call."""

    sets: list[tuple[Any, ...]]
    reference: torch.Tensor
    bytes_per_call: float
    extra: dict[str, Any]


def _decode_inputs(d: dict[str, Any], seed: int) -> tuple[Any, ...]:
    """K/V pages scattered at random over the pool, or in order (``DECODE_INPUTS``; made on
    the GPU: fast)."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    batch, kv_len, page = d["batch"], d["kv_len"], d["page_size"]
    pages = batch * (-(-kv_len // page))
    shape = (pages + 1, page, HEADS["num_kv_heads"], HEADS["head_dim"])
    k = torch.randn(shape, generator=gen, device=DEVICE).to(DTYPE)
    v = torch.randn(shape, generator=gen, device=DEVICE).to(DTYPE)
    tables = torch.randperm(pages + 1, generator=gen, device=DEVICE)[:pages]
    if DECODE_INPUTS["page_order"] == "sequential":  # (the permutation still drawn: same q)
        tables = torch.arange(1, pages + 1, device=DEVICE)
    tables = tables.view(batch, -1).to(torch.int32)
    q = torch.randn(batch, HEADS["num_q_heads"], HEADS["head_dim"], generator=gen,
                    device=DEVICE).to(DTYPE)  # fmt: skip
    lens = torch.full((batch,), kv_len, dtype=torch.int32, device=DEVICE)
    return q, k, v, tables, lens, HEADS["head_dim"] ** -0.5


def _decode_workload(d: dict[str, Any], reference: bool = True) -> Workload:
    from tokenspeed.kernels.reference.attention import paged_decode_attention as ref

    inputs = _decode_inputs(d, 0)  # one set is ~0.5 GB, far beyond twice the L2
    q = inputs[0]
    kv = 2 * d["batch"] * d["kv_len"] * HEADS["num_kv_heads"] * HEADS["head_dim"]
    kv *= q.element_size()
    want = ref(*inputs) if reference else q
    return Workload([inputs], want, kv + 2 * q.numel() * q.element_size(), {})


_WEIGHTS: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}


def _moe_weights(hidden: int, inter: int, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All experts' ``w13``/``w2`` (1.2 GB at Qwen3-30B-A3B), made once for every batch size."""
    key = (hidden, inter, experts, DEVICE, DTYPE, MOE["w2_order"])
    if key not in _WEIGHTS:
        gen = torch.Generator(device=DEVICE).manual_seed(0)
        w13 = torch.randn(experts, 2 * inter, hidden, generator=gen, device=DEVICE)
        w2 = torch.randn(experts, hidden, inter, generator=gen, device=DEVICE)
        w2 = w2.mul_(inter**-0.5).to(DTYPE)
        if MOE["w2_order"] == "n":
            w2 = w2.transpose(1, 2).contiguous().transpose(1, 2)
        _WEIGHTS[key] = (w13.mul_(hidden**-0.5).to(DTYPE), w2)
    return _WEIGHTS[key]


def _moe_workload(d: dict[str, Any], l2: int, reference: bool = True) -> Workload:
    """Shared weights; per set its own x and routing, enough sets that the experts touched
    in one cycle exceed three times the L2."""
    from tokenspeed.kernels.reference.moe import fused_moe as ref

    h, i, e, k, tokens = MOE["hidden"], MOE["intermediate"], MOE["num_experts"], MOE["top_k"], d["tokens"]  # fmt: skip
    w13, w2 = _moe_weights(h, i, e)
    gen = torch.Generator(device=DEVICE).manual_seed(tokens)
    per_expert = 3 * i * h * w13.element_size()
    sets, used = [], []
    while not sets or (sum(used) * per_expert < 3 * l2 and len(sets) < 16):
        x = torch.randn(tokens, h, generator=gen, device=DEVICE).to(DTYPE)
        scores = torch.rand(tokens, e, generator=gen, device=DEVICE)
        weights, ids = scores.topk(k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        sets.append((x, w13, w2, weights, ids.to(torch.int32)))
        used.append(int(torch.unique(ids).numel()))
    mean_used = sum(used) / len(used)
    io = 2 * tokens * h * w13.element_size()
    want = ref(*sets[0]) if reference else sets[0][0]
    return Workload(sets, want, mean_used * per_expert + io,
                    {"experts_used": mean_used, "weight_bytes": mean_used * per_expert,
                     "flops": 2 * 3 * tokens * k * h * i})  # fmt: skip


def _runner(case: Case) -> Callable[[tuple[Any, ...]], torch.Tensor]:
    if case.op == "decode" and (case.config or {}).get("kernel") == "flashinfer":
        from flashinfer_gqa import FlashInferDecode

        peer = FlashInferDecode(case.config["tensor_cores"], case.config.get("backend", "auto"))
        return lambda inp: peer(*inp)
    if case.op == "decode" and (case.config or {}).get("kernel") == "cute":
        from tokenspeed.kernels.cute_ops import decode_attention as cute_decode

        cfg = {k: v for k, v in case.config.items() if k != "kernel"}
        return lambda inp: cute_decode.paged_decode_attention(*inp, config=cfg)
    if case.op == "decode":
        from tokenspeed.kernels.triton_ops.decode_attention import paged_decode_attention

        return lambda inp: paged_decode_attention(*inp, config=case.config)
    from tokenspeed.kernels.triton_ops.fused_moe import fused_moe

    return lambda inp: fused_moe(*inp, config=case.config)


def _check(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float, bool]:
    """Max abs error, max error relative to the reference's largest value, pass (bf16)."""
    from tokenspeed.kernels.numerics import TOLERANCES

    atol, rtol = TOLERANCES[torch.bfloat16]  # the loosest: every dtype the sweep runs
    err = (out.double() - ref.double()).abs()
    scale = float(ref.double().abs().max().clamp_min(1e-12))
    ok = bool(torch.isfinite(out).all()) and bool((err <= atol + rtol * ref.double().abs()).all())
    return float(err.max()), float(err.max()) / scale, ok


# -- the device (a GPU; the plumbing test swaps these for CPU stand-ins) ----------------------


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _time(fn: Callable[[Any], Any], sets: list[Any], replays: int) -> Any:
    """CUDA-graph replay over the rotating sets, median (``kernels/timing.py``)."""
    from tokenspeed.kernels.timing import time_gpu

    return time_gpu(fn, sets, replays=replays)


def _bounds() -> dict[str, float]:
    from tokenspeed.kernels.timing import device_roofline

    return device_roofline()


def _l2() -> int:
    from tokenspeed.kernels.timing import l2_bytes

    return l2_bytes()


def _sms() -> int:
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).multi_processor_count
    return H200_SMS


def _environment() -> dict[str, Any]:
    from common import environment

    return environment() if DEVICE == "cuda" else {"device": DEVICE}


# -- compiled-kernel resources ---------------------------------------------------------------


def _jit_functions() -> list[Any]:
    from triton.runtime.jit import JITFunction

    from tokenspeed.kernels.triton_ops import decode_attention, fused_moe

    return [v for m in (decode_attention, fused_moe) for v in vars(m).values()
            if isinstance(v, JITFunction)]  # fmt: skip


def _compiled() -> dict[tuple[str, Any], Any]:
    """Every compiled kernel of the two modules, keyed by (function, cache key)."""
    found = {}
    for fn in _jit_functions():
        for cache in getattr(fn, "device_caches", {}).values():
            for key, kernel in cache[0].items():
                found[(fn.__name__, key)] = kernel
    return found


def _resources(before: dict[tuple[str, Any], Any]) -> list[dict[str, Any]]:
    """Registers, spills, shared memory and CTAs/SM of the kernels compiled since ``before``."""
    out = []
    for (name, key), kernel in _compiled().items():
        if (name, key) in before:
            continue
        try:
            regs, spills = int(kernel.n_regs), int(kernel.n_spills)
            shared, warps = int(kernel.metadata.shared), int(kernel.metadata.num_warps)
        except Exception:  # not loaded (never launched) or another Triton layout
            continue
        ctas = min(65536 // max(1, regs * 32 * warps), (228 << 10) // (shared + 1024),
                   64 // warps, 32)  # fmt: skip
        out.append({"kernel": name, "registers": regs, "spills": spills, "shared": shared,
                    "num_warps": warps, "ctas_per_sm": ctas})  # fmt: skip
    return out


# -- running ---------------------------------------------------------------------------------


def run_case(case: Case, work: Workload, bounds: dict[str, float], replays: int) -> dict[str, Any]:
    row: dict[str, Any] = {"case": case.label, "op": case.op, **case.dims,
                           "variant": case.variant, "config": case.config}  # fmt: skip
    fn = _runner(case)
    before = _compiled()
    start = time.perf_counter()
    out = fn(work.sets[0])
    _sync()
    row["first_call_s"] = round(time.perf_counter() - start, 2)  # mostly compile time
    row["compiled"] = _resources(before)
    max_abs, max_rel, ok = _check(out, work.reference)
    row.update(max_abs=max_abs, max_rel=max_rel, correct=ok)
    ablation = bool(case.config.get("ablation"))  # benchmark-only: wrong on purpose, timed
    if not ok and not ablation:
        row["status"] = "wrong"
        return row
    timing = _time(fn, work.sets, replays)
    gbps = work.bytes_per_call / (timing.median_us * 1e-6) / 1e9
    row.update(status="ok", median_us=timing.median_us, p10_us=timing.p10_us,
               p90_us=timing.p90_us, timing=timing.method, input_sets=len(work.sets),
               bytes=work.bytes_per_call, gbps=gbps,
               fraction_of_copy_bw=gbps / bounds["copy_gbps"], **work.extra)  # fmt: skip
    if "flops" in work.extra:
        tflops = work.extra["flops"] / (timing.median_us * 1e-6) / 1e12
        row.update(tflops=tflops, fraction_of_matmul=tflops / bounds["bf16_tflops"])
    row["meets_target"] = not ablation and row["fraction_of_copy_bw"] >= TARGETS[case.op]
    return row


def _workload(
    case: Case, cache: dict[tuple, Workload], l2: int, reference: bool = True
) -> Workload:
    if case.shape not in cache:
        d = case.dims
        cache[case.shape] = (
            _decode_workload(d, reference) if case.op == "decode"
            else _moe_workload(d, l2, reference)
        )  # fmt: skip
    return cache[case.shape]


_SETTINGS = ("DEVICE", "DTYPE", "HEADS", "MOE", "DECODE_INPUTS")


def _warm_worker(cases: list[Case], settings: dict[str, Any], l2: int) -> int:
    """Run each case once in this (child) process so that Triton compiles it; the binaries
    land in Triton's disk cache, where the main process finds them. Failures are left for
    the main run to report. ``settings`` carries the parent's module constants."""
    globals().update(settings)
    works: dict[tuple, Workload] = {}
    done = 0
    for case in cases:
        if (case.config or {}).get("kernel") == "cute":
            continue  # CuTe DSL compiles in the process that runs the kernel
        try:
            _runner(case)(_workload(case, works, l2, reference=False).sets[0])
            _sync()
            done += 1
        except Exception:
            if _context_lost(Exception(traceback.format_exc()), case):
                break
    return done


def warm_compile(cases: list[Case], workers: int, timeout_s: float, l2: int) -> str:
    """Compile every case's kernels in ``workers`` processes at once (Triton compiles one
    kernel at a time per process, and the sweep needs ~50), before anything is timed.

    Contiguous runs of the shape-sorted cases, so a worker builds few workloads. Workers still running at
    ``timeout_s`` are terminated; the main run compiles whatever is left."""
    import concurrent.futures as futures
    import multiprocessing

    if workers <= 0 or not cases:
        return "off"
    ordered = sorted(cases, key=lambda c: (c.op, c.shape))
    bounds = [len(ordered) * i // workers for i in range(workers + 1)]
    chunks = [ordered[lo:hi] for lo, hi in zip(bounds, bounds[1:], strict=False) if hi > lo]
    start = time.perf_counter()
    pool = futures.ProcessPoolExecutor(len(chunks), mp_context=multiprocessing.get_context("spawn"))
    settings = {name: globals()[name] for name in _SETTINGS}
    jobs = [pool.submit(_warm_worker, chunk, settings, l2) for chunk in chunks]
    finished, _ = futures.wait(jobs, timeout=timeout_s)
    for proc in list(getattr(pool, "_processes", {}).values()):
        proc.terminate()  # only our own workers, and only those still running
    pool.shutdown(wait=True, cancel_futures=True)
    ran = sum(j.result() for j in finished if not j.cancelled() and j.exception() is None)
    return f"{ran}/{len(cases)} cases in {len(chunks)} workers, {time.perf_counter() - start:.0f}s"


def sweep(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    sms = _sms()
    cases = plan(args.only, args.quick, sms, _labels(args.variants))
    warmed = warm_compile(cases, args.compile_workers, args.budget_s / 2, _l2())
    print(f"parallel compile: {warmed}", flush=True)
    meta = {"parallel_compile": warmed}
    bounds = _bounds()
    print(f"copy {bounds['copy_gbps']:.0f} GB/s, read {bounds['read_gbps']:.0f} GB/s, bf16 matmul "
          f"{bounds['bf16_tflops']:.0f} TFLOP/s, {len(cases)} cases", flush=True)  # fmt: skip
    works: dict[tuple, Workload] = {}
    rows: list[dict[str, Any]] = []
    lost = ""  # set once the CUDA context is unusable (a kernel faulted)
    for case in cases:
        elapsed = time.perf_counter() - started
        if lost or elapsed > args.budget_s:
            why = lost or f"budget: {elapsed:.0f}s > {args.budget_s}s"
            rows.append({"case": case.label, "variant": case.variant, "status": "skipped",
                         "reason": why})  # fmt: skip
            continue
        try:
            row = run_case(case, _workload(case, works, _l2()), bounds, args.replays)
        except Exception as err:  # a variant that does not compile or crashes is reported
            row = {"case": case.label, "op": case.op, **case.dims, "variant": case.variant,
                   "config": case.config, "status": "error",
                   "error": f"{type(err).__name__}: {str(err)[:2000]}",
                   "traceback": traceback.format_exc()[-4000:]}  # fmt: skip
            lost = _context_lost(err, case)
        rows.append(row)
        print(_line(row), flush=True)
        _write(args.out, bounds, rows, started, meta)
    print(_table(rows))
    _write(args.out, bounds, rows, started, meta)
    print(f"wrote {args.out} in {time.perf_counter() - started:.0f}s")
    return 0


def _context_lost(err: Exception, case: Case) -> str:
    """A reason to stop when ``err`` left the CUDA context unusable (sticky fault), else ""."""
    sticky = ("illegal memory access", "unspecified launch failure", "illegal instruction",
              "misaligned address", "device-side assert")  # fmt: skip
    text = str(err).lower()
    try:
        _sync()
    except Exception as again:  # the fault surfaced only now
        text += str(again).lower()
    if any(s in text for s in sticky):
        return f"CUDA context lost after {case.label} [{case.variant}]"
    return ""


def _write(
    path: Path,
    bounds: dict[str, float],
    rows: list[dict[str, Any]],
    started: float,
    meta: dict[str, Any],
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    report = {"benchmark": "sweep_gqa_moe", "environment": _environment(), "bounds": bounds,
              "targets": TARGETS, "wall_s": time.perf_counter() - started, **meta,
              "results": rows}  # fmt: skip
    path.write_text(json.dumps(report, indent=1, default=str) + "\n")


def _line(row: dict[str, Any]) -> str:
    head = f"{row['case']:32s} {row['variant']:20s}"
    if row.get("status") != "ok":
        why = row.get("error") or row.get("reason") or f"max_abs {row.get('max_abs', math.nan):.3g}"
        return f"{head} {row.get('status', '?').upper()}: {why.splitlines()[0][:120]}"
    regs = ",".join(f"{c['registers']}r/{c['ctas_per_sm']}" for c in row.get("compiled", []))
    return (f"{head} {row['median_us']:8.1f} us {row['gbps']:6.0f} GB/s "
            f"{100 * row['fraction_of_copy_bw']:5.1f}%{' *' if row['meets_target'] else '  '} "
            f"err {row['max_abs']:.2g} {regs}")  # fmt: skip


def _table(rows: list[dict[str, Any]]) -> str:
    """Best variant per shape against its target, then every row."""
    best: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row.get("status") == "ok" and not row["config"].get("ablation"):
            cur = best.get(row["case"])
            if cur is None or row["median_us"] < cur["median_us"]:
                best[row["case"]] = row
    lines = ["", "best per shape:"]
    for case, row in best.items():
        lines.append(f"  {case:32s} {row['variant']:20s} {row['median_us']:8.1f} us "
                     f"{100 * row['fraction_of_copy_bw']:5.1f}% (target "
                     f"{100 * TARGETS[row['op']]:.0f}%) {'MET' if row['meets_target'] else 'no'}")  # fmt: skip
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("sweep_gqa_moe.json"))
    parser.add_argument("--quick", action="store_true", help="fewer shapes and variants")
    parser.add_argument("--only", choices=("decode", "moe"), help="one of the two ops")
    parser.add_argument("--replays", type=int, default=30, help="CUDA-graph replays (median)")
    parser.add_argument("--budget-s", type=float, default=135.0,
                        help="start no case after this many seconds")  # fmt: skip
    parser.add_argument("--variants", help="comma-separated variant labels to keep")
    parser.add_argument("--compile-workers", type=int, default=8,
                        help="processes that compile the kernels first (0: off)")  # fmt: skip
    parser.add_argument("--w2-order", choices=("k", "n"), default="k",
                        help="MoE down weights stored [H, I] (k) or [I, H] (n)")  # fmt: skip
    parser.add_argument("--page-order", choices=("shuffled", "sequential"), default="shuffled",
                        help="decode: each request's pages scattered over the pool or in order")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    return parser.parse_args(argv)


def _labels(arg: str | None) -> set[str] | None:
    return {v.strip() for v in arg.split(",") if v.strip()} if arg else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    MOE["w2_order"] = args.w2_order
    DECODE_INPUTS["page_order"] = args.page_order
    if args.dry_run:
        sms = _sms()
        for case in plan(args.only, args.quick, sms, _labels(args.variants)):
            print(f"{case.label:32s} {case.variant:20s} {json.dumps(case.config)}")
        return 0
    if not torch.cuda.is_available():
        print("sweep_gqa_moe: needs a CUDA device (or --dry-run)", file=sys.stderr)
        return 2
    return sweep(args)


if __name__ == "__main__":
    sys.exit(main())
