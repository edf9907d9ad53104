"""The kernel registry: every implementation of every op, with what it needs to run.

A kernel is registered once, at import, with a declaration of where it can run (capability),
which tensor formats it accepts (signatures), which shape traits it supports (traits), how
much it should be preferred (priority band) and free-form tags (objectives read them). The
registry stores declarations only; `selection.py` decides between them.

Implementations are referenced lazily as ``"module:function"`` strings so that, for example,
Triton kernels are never imported in a process that never selects one.
"""

from __future__ import annotations

import enum
import importlib
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .traits import TraitRule, as_rule

__all__ = [
    "Capability",
    "KernelSpec",
    "Priority",
    "all_kernels",
    "candidates",
    "register_kernel",
    "unregister_kernel",
]


class Priority(enum.IntEnum):
    """Priority bands, lowest to highest; a kernel's priority is a band plus a small offset.

    REFERENCE: torch code that defines the op's meaning; always available, never fast.
    PORTABLE: Triton kernels that run on any GPU Triton supports.
    PERFORMANT: vendor or architecture tuned kernels.
    SPECIALIZED: kernels for one shape family (e.g. one head dim on one architecture).
    PLUGIN: third-party kernels registered through the ``tokenspeed.kernels`` entry points.
    """

    REFERENCE = 0
    PORTABLE = 100
    PERFORMANT = 200
    SPECIALIZED = 300
    PLUGIN = 400

    @classmethod
    def band_of(cls, priority: int) -> Priority:
        """The band a numeric priority falls in (offsets stay within a band)."""
        band = cls.REFERENCE
        for member in cls:
            if priority >= member:
                band = member
        return band


@dataclass(frozen=True)
class Capability:
    """Where a kernel can run.

    ``devices`` names device kinds ("cpu", "cuda"); ``vendors`` restricts GPU vendors
    ("nvidia", "amd"); ``min_compute``/``max_compute`` bound the CUDA compute capability.
    ``interpretable`` marks Triton kernels that may run on CPU tensors under
    ``TRITON_INTERPRET=1`` when selected explicitly (that is how CI exercises them).
    ``requires`` lists Python modules that must be importable.
    """

    devices: tuple[str, ...] = ("cpu", "cuda")
    vendors: tuple[str, ...] = ("nvidia", "amd")
    min_compute: tuple[int, int] | None = None
    max_compute: tuple[int, int] | None = None
    interpretable: bool = False
    requires: tuple[str, ...] = ()


ANY_DEVICE = Capability()


@dataclass(frozen=True)
class KernelSpec:
    """One registered implementation of ``family.mode``.

    ``signatures`` is a list of accepted format patterns: each maps a tensor role ("x",
    "q", "kv_cache", ...) to the formats it accepts; a call matches when some pattern
    accepts every role it names. An empty list accepts every format. ``traits`` maps a
    shape trait to the rule its value must satisfy. ``config_space`` and ``default_config``
    (lazy "module:function" strings) make a kernel tunable.
    """

    family: str
    mode: str
    name: str
    solution: str
    impl_path: str
    capability: Capability = ANY_DEVICE
    signatures: tuple[Mapping[str, frozenset[str]], ...] = ()
    traits: Mapping[str, TraitRule] = field(default_factory=dict)
    priority: int = Priority.REFERENCE
    tags: frozenset[str] = frozenset()
    config_space_path: str | None = None
    default_config_path: str | None = None
    description: str = ""

    @property
    def op(self) -> str:
        """The op key, ``family.mode``."""
        return f"{self.family}.{self.mode}"

    @property
    def band(self) -> Priority:
        """The priority band this kernel sits in."""
        return Priority.band_of(self.priority)

    @property
    def tunable(self) -> bool:
        """Whether the kernel takes a launch configuration that tuning can search."""
        return self.config_space_path is not None

    def impl(self) -> Callable[..., Any]:
        """The implementation, imported on first use."""
        return _resolve(self.impl_path)

    def config_space(self) -> Callable[[Mapping[str, Any]], list[dict[str, Any]]] | None:
        """Function from shape traits to the candidate configs tuning tries."""
        return _resolve(self.config_space_path) if self.config_space_path else None

    def default_config(self) -> Callable[[Mapping[str, Any]], dict[str, Any]] | None:
        """Function from shape traits to the untuned launch config."""
        return _resolve(self.default_config_path) if self.default_config_path else None

    def signature_mismatch(self, signature: Mapping[str, str]) -> str | None:
        """None when some declared pattern accepts ``signature``, else why not."""
        if not self.signatures:
            return None
        reasons = []
        for pattern in self.signatures:
            bad = [
                f"{role}={signature[role]} not in {{{', '.join(sorted(allowed))}}}"
                for role, allowed in pattern.items()
                if role in signature and signature[role] not in allowed
            ]
            if not bad:
                return None
            reasons.append("; ".join(bad))
        return reasons[0] if len(reasons) == 1 else " | ".join(reasons)

    def trait_mismatch(self, traits: Mapping[str, Any]) -> str | None:
        """None when every declared trait rule accepts ``traits``, else why not."""
        for name, rule in self.traits.items():
            if name in traits and not rule(traits[name]):
                return f"{name}={traits[name]!r} not {rule}"
        return None


_lock = threading.RLock()
_kernels: dict[str, dict[str, KernelSpec]] = {}
_generation = 0


def registry_generation() -> int:
    """A counter bumped on every (un)registration; selection caches key on it."""
    return _generation


def register_kernel(
    family: str,
    mode: str,
    *,
    name: str,
    solution: str,
    impl: str | Callable[..., Any],
    capability: Capability = ANY_DEVICE,
    signatures: Iterable[Mapping[str, str | Collection[str]]] = (),
    traits: Mapping[str, Any] | None = None,
    priority: int = Priority.REFERENCE,
    tags: Iterable[str] = (),
    config_space: str | None = None,
    default_config: str | None = None,
    description: str = "",
    replace: bool = False,
) -> KernelSpec:
    """Declare a kernel for ``family.mode``; returns its spec.

    ``impl`` is a callable or a lazy ``"module:function"`` path taking the op's public
    arguments (plus ``config=`` when the kernel is tunable). Names are unique per op;
    ``replace=True`` swaps an existing entry (plugins use it to upgrade a kernel).
    """
    global _generation
    if isinstance(impl, str):
        impl_path = impl
    else:
        impl_path = _register_callable(impl)
    spec = KernelSpec(
        family=family,
        mode=mode,
        name=name,
        solution=solution,
        impl_path=impl_path,
        capability=capability,
        signatures=tuple(
            {role: frozenset([fmt] if isinstance(fmt, str) else fmt) for role, fmt in p.items()}
            for p in signatures
        ),
        traits={key: as_rule(rule) for key, rule in (traits or {}).items()},
        priority=int(priority),
        tags=frozenset(tags),
        config_space_path=config_space,
        default_config_path=default_config,
        description=description,
    )
    with _lock:
        table = _kernels.setdefault(spec.op, {})
        if name in table and not replace:
            raise ValueError(f"kernel {name!r} is already registered for {spec.op}")
        table[name] = spec
        _generation += 1
    return spec


def unregister_kernel(family: str, mode: str, name: str) -> None:
    """Remove a kernel (tests and plugins that withdraw an entry use it)."""
    global _generation
    with _lock:
        _kernels.get(f"{family}.{mode}", {}).pop(name, None)
        _generation += 1


def candidates(family: str, mode: str) -> list[KernelSpec]:
    """Every kernel registered for ``family.mode``, highest priority first."""
    from .plugins import load_plugins

    load_plugins()
    with _lock:
        specs = list(_kernels.get(f"{family}.{mode}", {}).values())
    return sorted(specs, key=lambda s: (-s.priority, s.name))


def all_kernels() -> list[KernelSpec]:
    """Every registered kernel of every op, grouped by op."""
    from .plugins import load_plugins

    load_plugins()
    with _lock:
        return [spec for op in sorted(_kernels) for spec in _kernels[op].values()]


_callables: dict[str, Callable[..., Any]] = {}
_resolved: dict[str, Any] = {}


def _register_callable(fn: Callable[..., Any]) -> str:
    path = f"<callable>:{id(fn)}"
    _callables[path] = fn
    return path


def _resolve(path: str) -> Any:
    """Import ``module:attribute`` once and memoise it."""
    found = _resolved.get(path)
    if found is not None:
        return found
    if path in _callables:
        found = _callables[path]
    else:
        module_name, _, attr = path.partition(":")
        found = getattr(importlib.import_module(module_name), attr)
    _resolved[path] = found
    return found
