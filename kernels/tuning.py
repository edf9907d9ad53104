"""Searching launch configurations on the GPU present, per op and shape bucket.

For each case (an op at one of the shapes a model will run) tuning:
1. runs the public op once to capture the exact (signature, traits) it asks the selector
   for, hence the shape bucket the runtime will look up;
2. times the untuned default choice (kernel and its default config);
3. times every feasible non-reference kernel over its config space;
4. keeps the fastest as a ``TunedEntry``.
The result is a ``TuningTable`` for this device and Triton version, which the selector
ranks first for matching buckets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import registry
from .device import device_info, triton_version
from .model_shapes import ModelShapes
from .registry import KernelSpec, Priority
from .selection import capture_dispatch, explain_selection
from .timing import rotating, time_gpu
from .tuned import TunedEntry, TuningTable, clear_tuning
from .workloads import Inputs, call_op, make_inputs

__all__ = ["TuneCase", "TuneResult", "tune", "tuning_cases"]

TUNABLE_OPS = (
    "attention.decode",
    "attention.extend",
    "moe.experts",
    "moe.route",
    "norm.rms",
    "norm.fused_add_rms",
    "activation.silu_and_mul",
    "rotary.apply",
    "kv_cache.store",
)
TOKEN_COUNTS = (1, 16, 128, 1024, 8192)
DECODE_BATCHES = (1, 8, 32, 64, 128)
DECODE_LENGTHS = (1024, 4096, 16384)
MAX_DECODE_TOKENS = 1 << 20  # skip decode cases whose cache exceeds this many tokens
EXTEND_CASES = ((1, 512, 0), (1, 2048, 0), (1, 8192, 0), (4, 512, 2048), (16, 128, 4096))
MOE_TOKENS = (1, 4, 16, 64, 256, 1024, 4096)


@dataclass(frozen=True)
class TuneCase:
    """One op at one shape."""

    op: str
    shape: dict[str, Any]


@dataclass
class TuneResult:
    """What tuning found for one case."""

    case: TuneCase
    bucket: str
    default_kernel: str
    default_config: dict[str, Any]
    default_us: float
    best_kernel: str
    best_config: dict[str, Any]
    best_us: float
    tried: int
    failures: list[str] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        """Untuned time over tuned time."""
        return self.default_us / self.best_us if self.best_us else 1.0


def tuning_cases(model: ModelShapes, ops: Iterable[str], page_size: int = 16) -> list[TuneCase]:
    """The shape buckets ``model`` will hit, for each requested op."""
    m = model
    attn = {"num_q_heads": m.num_q_heads, "num_kv_heads": m.num_kv_heads, "head_dim": m.head_dim}
    cases: list[TuneCase] = []
    for op in ops:
        if op in ("norm.rms", "norm.fused_add_rms"):
            cases += [TuneCase(op, {"tokens": t, "hidden": m.hidden}) for t in TOKEN_COUNTS]
        elif op == "activation.silu_and_mul":
            cases += [
                TuneCase(op, {"tokens": t, "intermediate": m.intermediate}) for t in TOKEN_COUNTS
            ]
        elif op == "rotary.apply":
            cases += [
                TuneCase(op, {"tokens": t, **attn, "rot_dim": m.rot_dim, "is_neox": True})
                for t in TOKEN_COUNTS
            ]
        elif op == "kv_cache.store":
            cases += [
                TuneCase(
                    op,
                    {
                        "tokens": t,
                        "num_kv_heads": m.num_kv_heads,
                        "head_dim": m.head_dim,
                        "page_size": page_size,
                    },
                )
                for t in TOKEN_COUNTS
            ]
        elif op == "attention.decode":
            cases += [
                TuneCase(op, {"batch": b, "kv_len": n, **attn, "page_size": page_size})
                for b in DECODE_BATCHES
                for n in DECODE_LENGTHS
                if b * n <= MAX_DECODE_TOKENS
            ]
        elif op == "attention.extend":
            cases += [
                TuneCase(
                    op, {"batch": b, "q_len": q, "prefix_len": p, **attn, "page_size": page_size}
                )
                for b, q, p in EXTEND_CASES
            ]
        elif op == "moe.route" and m.is_moe:
            route = {"num_experts": m.num_experts, "top_k": m.top_k, "scoring": m.scoring,
                     "n_group": m.n_group, "topk_group": m.topk_group}  # fmt: skip
            cases += [TuneCase(op, {"tokens": t, **route}) for t in TOKEN_COUNTS]
        elif op == "moe.experts" and m.is_moe:
            # w2 stored as the runtime's FusedMoE keeps it ([E, I, H])
            moe = {"hidden": m.hidden, "intermediate": m.moe_intermediate,
                   "num_experts": m.num_experts, "top_k": m.top_k,
                   "w2_contiguous": "hidden"}  # fmt: skip
            cases += [TuneCase(op, {"tokens": t, **moe}) for t in MOE_TOKENS]
    return cases


def _thin(configs: list[dict[str, Any]], limit: int | None) -> list[dict[str, Any]]:
    """At most ``limit`` configs, spread evenly over the space."""
    if not limit or len(configs) <= limit:
        return configs
    step = len(configs) / limit
    return [configs[int(i * step)] for i in range(limit)]


def _runner(spec: KernelSpec, config: dict[str, Any] | None) -> Callable[[Inputs], Any]:
    impl = spec.impl()
    if spec.tunable:
        return lambda inp: impl(*inp.args, **inp.kwargs, config=config)
    return lambda inp: impl(*inp.args, **inp.kwargs)


def tune(
    cases: Sequence[TuneCase],
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | None = None,
    max_configs: int | None = None,
    replays: int = 20,
    on_step: Callable[[str], None] | None = None,
) -> tuple[TuningTable, list[TuneResult]]:
    """Tune every case on the current CUDA device; returns the table and per-case results."""
    device = device or torch.device("cuda", torch.cuda.current_device())
    dev = device_info(device)
    clear_tuning(skip_default_for=dev)  # measure against untuned choices
    table = TuningTable(device=dev.name, device_slug=dev.slug, triton=triton_version())
    results: list[TuneResult] = []
    for case in cases:
        sets = rotating(
            lambda i, c=case: make_inputs(c.op, c.shape, dtype, device, seed=i), Inputs.nbytes
        )
        with capture_dispatch() as calls:
            call_op(case.op, sets[0])
        call = calls[0]
        default = explain_selection(
            call.family, call.mode, call.signature, traits=call.traits, device=dev
        )
        specs = {s.name: s for s in registry.candidates(call.family, call.mode)}
        default_spec = specs[default.chosen]
        default_cfg = dict(default.config)
        default_us = time_gpu(
            _runner(default_spec, default_cfg or None), sets, replays=replays
        ).median_us
        best = (default_us, default_spec.name, default_cfg)
        tried, failures = 1, []
        feasible = [c.kernel for c in default.candidates if c.kept]
        for name in feasible:
            spec = specs[name]
            if spec.band == Priority.REFERENCE:
                continue
            space = spec.config_space()
            configs = _thin(space(call.traits), max_configs) if space else [None]
            for cfg in configs:
                if on_step:
                    on_step(f"{case.op} {name} {cfg or ''}")
                try:
                    us = time_gpu(_runner(spec, cfg), sets, replays=replays).median_us
                except Exception as err:  # a config may not fit (shared memory, registers)
                    failures.append(f"{name} {cfg}: {type(err).__name__}")
                    continue
                tried += 1
                if us < best[0]:
                    best = (us, name, dict(cfg or {}))
        entry = TunedEntry(
            kernel=best[1], config=best[2], time_us=best[0], default_time_us=default_us
        )
        table.entries.setdefault(call.op, {})[call.bucket] = entry
        results.append(
            TuneResult(
                case,
                call.bucket,
                default_spec.name,
                default_cfg,
                default_us,
                best[1],
                best[2],
                best[0],
                tried,
                failures,
            )  # fmt: skip
        )
        del sets
        torch.cuda.empty_cache()
    return table, results


def count_configs(cases: Sequence[TuneCase], max_configs: int | None) -> int:
    """How many measurements ``tune`` will make at most (for a progress bar); CPU-safe."""
    total = 0
    for case in cases:
        family, mode = case.op.split(".")
        for spec in registry.candidates(family, mode):
            if spec.band == Priority.REFERENCE:
                continue
            space = spec.config_space()
            traits = _estimate_traits(case)
            total += len(_thin(space(traits), max_configs)) if space else 1
    return total


def _estimate_traits(case: TuneCase) -> dict[str, Any]:
    """Traits close to what the op computes, without building tensors (for counting)."""
    from .traits import bucket

    s = case.shape
    tokens = s.get("tokens", s.get("batch", 1) * s.get("q_len", 1))
    return {
        **s,
        "num_tokens": bucket(tokens),
        "batch": bucket(s.get("batch", 1)),
        "kv_len": bucket(s.get("kv_len", 1)),
        "num_kv_heads": s.get("num_kv_heads", 1),
        "kv_groups": bucket(s.get("batch", 1) * s.get("num_kv_heads", 1)),
        "head_dim": s.get("head_dim", 128),
    }
