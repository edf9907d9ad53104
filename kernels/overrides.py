"""Forcing a kernel: environment variable > call argument > context manager > TOML file.

An override names a kernel (``triton_paged_decode``) or a solution (``triton``, ``torch``)
for one op. The environment variable wins so an operator can always force a kernel in a
deployed process; a TOML file (``--kernel-config``) sets process-wide defaults; a context
manager scopes an override to a block of code (tests, debugging a layer).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

__all__ = [
    "OverrideSource",
    "active_override",
    "clear_kernel_config",
    "env_var_name",
    "kernel_override",
    "load_kernel_config",
]

ENV_PREFIX = "TOKENSPEED_KERNEL_OVERRIDE_"


@dataclass(frozen=True)
class OverrideSource:
    """An override in force for one op, and where it came from."""

    kernel: str
    source: str  # "env", "argument", "context", "config"

    def __str__(self) -> str:
        return f"{self.kernel} (from {self.source})"


@functools.cache  # every op call asks (the dispatch fast path); the answer never changes
def env_var_name(family: str, mode: str) -> str:
    """``TOKENSPEED_KERNEL_OVERRIDE_<FAMILY>_<MODE>`` for an op."""
    return ENV_PREFIX + re.sub(r"[^A-Z0-9]+", "_", f"{family}_{mode}".upper())


_context: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "tokenspeed_kernel_overrides", default=MappingProxyType({})
)
_config_overrides: dict[str, str] = {}
_config_path: Path | None = None


@contextlib.contextmanager
def kernel_override(op: str | Mapping[str, str], kernel: str | None = None) -> Iterator[None]:
    """Force kernels inside a ``with`` block.

    ``kernel_override("attention.decode", "triton")`` or
    ``kernel_override({"norm.rms": "torch_rms_norm", "moe.experts": "triton"})``.
    Nested blocks stack; the innermost wins for the ops it names.
    """
    if isinstance(op, str):
        if kernel is None:
            raise TypeError("kernel_override(op, kernel) needs the kernel name")
        new = {op: kernel}
    else:
        new = dict(op)
    token = _context.set({**_context.get(), **new})
    try:
        yield
    finally:
        _context.reset(token)


def active_override(family: str, mode: str, argument: str | None = None) -> OverrideSource | None:
    """The override in force for ``family.mode``, honouring the precedence order."""
    env = os.environ.get(env_var_name(family, mode))
    if env:
        return OverrideSource(env.strip(), "env")
    if argument:
        return OverrideSource(argument, "argument")
    op = f"{family}.{mode}"
    scoped = _context.get().get(op)
    if scoped:
        return OverrideSource(scoped, "context")
    configured = _config_overrides.get(op)
    if configured:
        return OverrideSource(configured, "config")
    return None


def load_kernel_config(path: str | os.PathLike[str]) -> dict[str, str]:
    """Load a kernel configuration file; the server calls this for ``--kernel-config``.

    A ``.json`` file is a tuning result written by ``tokenspeed tune-kernels``. A ``.toml``
    file holds overrides and optionally points at a tuning file::

        tuning = "~/.cache/tokenspeed/kernels/nvidia-h200.json"   # optional
        [overrides]
        "attention.decode" = "triton_paged_decode"
        [overrides.norm]
        rms = "torch"

    Returns the overrides now in force from the file.
    """
    from .tuned import load_tuning_file

    global _config_path
    file = Path(path).expanduser()
    if file.suffix == ".json":
        load_tuning_file(file)
        _config_path = file
        return dict(_config_overrides)
    with file.open("rb") as fh:
        data = tomllib.load(fh)
    unknown = set(data) - {"overrides", "tuning"}
    if unknown:
        raise ValueError(f"{file}: unknown keys {sorted(unknown)}; expected 'overrides', 'tuning'")
    overrides: dict[str, str] = {}
    for key, value in data.get("overrides", {}).items():
        if isinstance(value, dict):
            for mode, kernel in value.items():
                overrides[f"{key}.{mode}"] = str(kernel)
        elif "." in key:
            overrides[key] = str(value)
        else:
            raise ValueError(f"{file}: override key {key!r} must be 'family.mode'")
    if "tuning" in data:
        tuning = Path(str(data["tuning"])).expanduser()
        if not tuning.is_absolute():
            tuning = file.parent / tuning
        load_tuning_file(tuning)
    _config_overrides.clear()
    _config_overrides.update(overrides)
    _config_path = file
    _bump()
    return dict(overrides)


def clear_kernel_config() -> None:
    """Forget overrides loaded from a file (tests use it)."""
    global _config_path
    _config_overrides.clear()
    _config_path = None
    _bump()


def kernel_config_summary() -> dict[str, object]:
    """The loaded configuration as plain data (for /get_server_info)."""
    return {
        "path": str(_config_path) if _config_path else None,
        "overrides": dict(_config_overrides),
        "env": {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)},
    }


def _bump() -> None:
    from . import selection

    selection.clear_selection_cache()
