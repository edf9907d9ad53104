"""Choosing one kernel per call site, explaining the choice and remembering it.

Selection runs in stages, each of which either keeps a candidate or drops it with a reason:
capability (device kind, vendor, compute capability, importable modules), format signature,
shape traits, objective filters. An override, if one is in force, then picks by name among
the survivors. Otherwise the survivors are ranked by tuned results (a kernel the tuning file
measured fastest for this shape bucket), then the objective, then priority. The result is
cached per (op, device, signature, trait bucket, objective, override) and recorded once per
key in a process-wide table that ``/get_server_info`` and the dashboard read.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from . import registry
from .device import DeviceInfo, device_info, triton_interpret
from .overrides import OverrideSource, active_override
from .registry import KernelSpec, Priority
from .tuned import tuned_entry, tuning_generation

__all__ = [
    "OBJECTIVES",
    "CandidateVerdict",
    "Explanation",
    "KernelSelectionError",
    "Selection",
    "SelectionRecord",
    "DispatchCall",
    "capture_dispatch",
    "clear_selection_cache",
    "dispatch",
    "explain_selection",
    "select_kernel",
    "selection_records",
    "shape_bucket",
]

OBJECTIVES = ("default", "latency", "throughput", "determinism", "portability", "debug")


class KernelSelectionError(RuntimeError):
    """No kernel can run this call, or an override names one that cannot."""


@dataclass(frozen=True)
class Selection:
    """The chosen kernel for one call site, with its launch config and the reason."""

    kernel: KernelSpec
    config: Mapping[str, Any]
    reason: str
    bucket: str
    run: Callable[..., Any] = field(repr=False, compare=False)

    @property
    def name(self) -> str:
        """The chosen kernel's name."""
        return self.kernel.name


@dataclass(frozen=True)
class CandidateVerdict:
    """One candidate in an explanation: whether it survived, and why."""

    kernel: str
    solution: str
    priority: int
    band: str
    kept: bool
    reason: str
    tuned: bool = False


@dataclass(frozen=True)
class Explanation:
    """Every candidate for a call with its verdict, and the final choice."""

    op: str
    device: str
    bucket: str
    objective: str
    override: str | None
    chosen: str | None
    config: Mapping[str, Any]
    reason: str
    candidates: tuple[CandidateVerdict, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready)."""
        out = asdict(self)
        out["config"] = dict(self.config)
        return out

    def __str__(self) -> str:
        lines = [
            f"{self.op} on {self.device} [{self.bucket}] objective={self.objective}"
            + (f" override={self.override}" if self.override else ""),
            f"  -> {self.chosen or 'nothing'}: {self.reason}"
            + (f" config={dict(self.config)}" if self.config else ""),
        ]
        for c in self.candidates:
            mark = "kept   " if c.kept else "dropped"
            lines.append(f"  {mark} {c.kernel:<32} {c.band:<11} p={c.priority:<4} {c.reason}")
        return "\n".join(lines)


@dataclass(frozen=True)
class SelectionRecord:
    """One selection made in this process (first time its key was seen)."""

    op: str
    device: str
    bucket: str
    objective: str
    kernel: str
    reason: str
    config: Mapping[str, Any]
    time: float


def shape_bucket(signature: Mapping[str, str], traits: Mapping[str, Any]) -> str:
    """Canonical text key of a call's formats and (already bucketed) traits.

    The tuning file uses the same key, so tuned entries line up with runtime calls.
    """
    sig = ",".join(f"{k}={v}" for k, v in sorted(signature.items()))
    shp = ",".join(f"{k}={v}" for k, v in sorted(traits.items()))
    return f"{sig}|{shp}"


def _device_label(info: DeviceInfo) -> str:
    return info.kind if info.kind == "cpu" else f"{info.kind}:{info.name}"


def _capability_problem(spec: KernelSpec, dev: DeviceInfo) -> tuple[str | None, bool]:
    """(why the kernel cannot run here or None, whether it runs only if named explicitly)."""
    cap = spec.capability
    for module in cap.requires:
        if not _importable(module):
            return f"needs Python module {module!r}", False
    if dev.kind not in cap.devices:
        if dev.kind == "cpu" and cap.interpretable:
            if triton_interpret():
                return None, True
            return "needs a GPU (on CPU only under TRITON_INTERPRET=1 when selected)", False
        return f"runs on {'/'.join(cap.devices)}, not {dev.kind}", False
    if dev.kind == "cuda":
        if dev.vendor not in cap.vendors:
            return f"needs a {'/'.join(cap.vendors)} GPU, not {dev.vendor}", False
        if cap.min_compute and dev.compute and dev.compute < cap.min_compute:
            return f"needs compute capability >= {cap.min_compute}, have {dev.compute}", False
        if cap.max_compute and dev.compute and dev.compute > cap.max_compute:
            return f"needs compute capability <= {cap.max_compute}, have {dev.compute}", False
    return None, False


@functools.cache
def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _objective_problem(spec: KernelSpec, objective: str) -> str | None:
    if objective == "determinism" and "deterministic" not in spec.tags:
        return "objective 'determinism' keeps only kernels tagged deterministic"
    if objective == "debug" and spec.band != Priority.REFERENCE:
        return "objective 'debug' keeps only reference kernels"
    return None


def _objective_score(spec: KernelSpec, objective: str) -> int:
    if objective in ("latency", "throughput"):
        return 1 if objective in spec.tags else 0
    if objective == "portability":
        return {Priority.PORTABLE: 2, Priority.REFERENCE: 1}.get(spec.band, 0)
    return 0


def _match_override(name: str, specs: list[KernelSpec]) -> KernelSpec | None:
    for spec in specs:
        if spec.name == name:
            return spec
    by_solution = [s for s in specs if s.solution == name]
    return by_solution[0] if by_solution else None


def _evaluate(
    family: str,
    mode: str,
    dev: DeviceInfo,
    signature: Mapping[str, str],
    traits: Mapping[str, Any],
    objective: str,
    override: OverrideSource | None,
) -> Explanation:
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; choose from {OBJECTIVES}")
    op = f"{family}.{mode}"
    bucket = shape_bucket(signature, traits)
    specs = registry.candidates(family, mode)
    if not specs:
        raise KernelSelectionError(f"no kernel is registered for {op}")
    tuned = tuned_entry(dev, op, bucket)

    verdicts: dict[str, tuple[bool, str]] = {}
    survivors: list[KernelSpec] = []
    explicit_only: list[KernelSpec] = []
    for spec in specs:
        problem, needs_explicit = _capability_problem(spec, dev)
        problem = (
            problem
            or _prefixed("format", spec.signature_mismatch(signature))
            or _prefixed("trait", spec.trait_mismatch(traits))
            or _objective_problem(spec, objective)
        )
        if problem:
            verdicts[spec.name] = (False, problem)
        elif needs_explicit:
            verdicts[spec.name] = (False, "runs on CPU under the Triton interpreter only if named")
            explicit_only.append(spec)
        else:
            verdicts[spec.name] = (True, "feasible")
            survivors.append(spec)

    chosen: KernelSpec | None = None
    reason = ""
    if override is not None:
        chosen = _match_override(override.kernel, survivors + explicit_only)
        if chosen is None:
            target = _match_override(override.kernel, specs)
            why = verdicts[target.name][1] if target else "no kernel or solution by that name"
            raise KernelSelectionError(
                f"override {override} for {op} cannot be used: {why}. "
                f"Registered: {', '.join(s.name for s in specs)}"
            )
        reason = f"override {override}"
    elif survivors:
        tuned_name = tuned.kernel if tuned else None

        def rank(spec: KernelSpec) -> tuple[int, int, int]:
            return (spec.name == tuned_name, _objective_score(spec, objective), spec.priority)

        chosen = max(survivors, key=rank)
        if tuned and chosen.name == tuned_name:
            reason = f"tuned fastest for this bucket ({tuned.describe()})"
        elif _objective_score(chosen, objective) > 0:
            reason = f"preferred by objective '{objective}'"
        elif len(survivors) == 1:
            reason = "only feasible kernel"
        else:
            reason = f"highest priority ({chosen.band.name.lower()} band) among feasible"

    config: dict[str, Any] = {}
    if chosen is not None and chosen.tunable:
        if tuned and tuned.kernel == chosen.name and tuned.config:
            config = dict(tuned.config)
        else:
            default = chosen.default_config()
            try:
                config = dict(default(traits)) if default else {}
            except KeyError:
                # Asked without the shape traits the launch config depends on (e.g. "which
                # kernel would this op use here?"): the choice stands, the config is per call.
                config = {}

    candidates = []
    for spec in specs:
        kept, why = verdicts[spec.name]
        if spec is chosen:
            kept, why = True, f"chosen: {reason}"
        elif kept:
            why = "feasible, ranked lower"
        candidates.append(
            CandidateVerdict(
                kernel=spec.name,
                solution=spec.solution,
                priority=spec.priority,
                band=spec.band.name,
                kept=kept,
                reason=why,
                tuned=bool(tuned and tuned.kernel == spec.name),
            )
        )
    if chosen is None:
        reason = "no feasible kernel"
    return Explanation(
        op=op,
        device=_device_label(dev),
        bucket=bucket,
        objective=objective,
        override=str(override) if override else None,
        chosen=chosen.name if chosen else None,
        config=config,
        reason=reason,
        candidates=tuple(candidates),
    )


def _prefixed(what: str, problem: str | None) -> str | None:
    return f"{what}: {problem}" if problem else None


def _resolve_device(device: torch.device | str | DeviceInfo | None) -> DeviceInfo:
    """A DeviceInfo passes through (tests, tuning for a named device); else look it up."""
    if isinstance(device, DeviceInfo):
        return device
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return device_info(device)


def explain_selection(
    family: str,
    mode: str,
    signature: Mapping[str, str] | None = None,
    *,
    traits: Mapping[str, Any] | None = None,
    objective: str = "default",
    override: str | None = None,
    device: torch.device | str | DeviceInfo | None = None,
) -> Explanation:
    """Every candidate for ``family.mode`` with why it was kept or dropped, and the choice.

    Unlike ``select_kernel`` this never raises for an infeasible call; the explanation
    says so instead (an override that cannot be honoured is reported in ``reason``).
    """
    dev = _resolve_device(device)
    source = active_override(family, mode, override)
    try:
        return _evaluate(family, mode, dev, signature or {}, traits or {}, objective, source)
    except KernelSelectionError as err:
        plain = _evaluate(family, mode, dev, signature or {}, traits or {}, objective, None)
        return Explanation(**{**plain.__dict__, "override": str(source), "reason": str(err)})


_cache: dict[tuple[Any, ...], Selection] = {}
_records: dict[tuple[str, str, str, str], SelectionRecord] = {}
_lock = threading.Lock()


def select_kernel(
    family: str,
    mode: str,
    signature: Mapping[str, str] | None = None,
    *,
    traits: Mapping[str, Any] | None = None,
    objective: str = "default",
    override: str | None = None,
    device: torch.device | str | DeviceInfo | None = None,
) -> Selection:
    """Pick the kernel for one call of ``family.mode``; raises KernelSelectionError if none.

    ``signature`` maps tensor roles to formats (dtype names), ``traits`` maps shape traits
    to values (bucket per-step sizes with ``traits.bucket``). The answer is cached.
    """
    dev = _resolve_device(device)
    return _select(family, mode, dev, signature or {}, traits or {}, objective, override)


@dataclass(frozen=True)
class DispatchCall:
    """What one op call asked the selector for (captured by tuning and benchmarks)."""

    family: str
    mode: str
    device: DeviceInfo
    signature: Mapping[str, str]
    traits: Mapping[str, Any]

    @property
    def op(self) -> str:
        return f"{self.family}.{self.mode}"

    @property
    def bucket(self) -> str:
        return shape_bucket(self.signature, self.traits)


_capture: contextvars.ContextVar[list[DispatchCall] | None] = contextvars.ContextVar(
    "tokenspeed_kernel_capture", default=None
)


@contextlib.contextmanager
def capture_dispatch() -> Iterator[list[DispatchCall]]:
    """Collect the (op, signature, traits) of every op call inside the block.

    Tuning uses it so its shape buckets are exactly the ones the ops will ask for.
    """
    calls: list[DispatchCall] = []
    token = _capture.set(calls)
    try:
        yield calls
    finally:
        _capture.reset(token)


def dispatch(
    family: str,
    mode: str,
    device: torch.device,
    signature: Mapping[str, str],
    traits: Mapping[str, Any],
    objective: str = "default",
) -> Selection:
    """The ops' fast path: ``select_kernel`` for a device already in hand."""
    dev = device_info(device)
    calls = _capture.get()
    if calls is not None:
        calls.append(DispatchCall(family, mode, dev, dict(signature), dict(traits)))
    return _select(family, mode, dev, signature, traits, objective, None)


def _select(
    family: str,
    mode: str,
    dev: DeviceInfo,
    signature: Mapping[str, str],
    traits: Mapping[str, Any],
    objective: str,
    override: str | None,
) -> Selection:
    source = active_override(family, mode, override)
    key = (
        family,
        mode,
        dev,
        tuple(sorted(signature.items())),
        tuple(sorted(traits.items())),
        objective,
        source,
        registry.registry_generation(),
        tuning_generation(),
    )
    hit = _cache.get(key)
    if hit is not None:
        return hit
    explanation = _evaluate(family, mode, dev, signature, traits, objective, source)
    if explanation.chosen is None:
        raise KernelSelectionError(f"no kernel can run {explanation.op}:\n{explanation}")
    spec = next(s for s in registry.candidates(family, mode) if s.name == explanation.chosen)
    impl = spec.impl()
    run = functools.partial(impl, config=explanation.config) if spec.tunable else impl
    selection = Selection(
        kernel=spec,
        config=explanation.config,
        reason=explanation.reason,
        bucket=explanation.bucket,
        run=run,
    )
    with _lock:
        _cache[key] = selection
        _records[(explanation.op, explanation.device, explanation.bucket, objective)] = (
            SelectionRecord(
                op=explanation.op,
                device=explanation.device,
                bucket=explanation.bucket,
                objective=objective,
                kernel=spec.name,
                reason=explanation.reason,
                config=dict(explanation.config),
                time=time.time(),
            )
        )
    return selection


def selection_records() -> list[dict[str, Any]]:
    """Every selection this process made, as plain data (op, bucket, kernel, reason...)."""
    with _lock:
        records = sorted(_records.values(), key=lambda r: (r.op, r.bucket))
    return [{**asdict(r), "config": dict(r.config)} for r in records]


def clear_selection_cache(*, records: bool = False) -> None:
    """Drop cached selections (and optionally the records); overrides/tuning loads call it."""
    with _lock:
        _cache.clear()
        if records:
            _records.clear()
