"""Tuned results: the file ``tokenspeed tune-kernels`` writes and the selector reads.

A tuning file belongs to one device and one Triton version; inside, each op maps a shape
bucket (``selection.shape_bucket``) to the fastest kernel measured for it, its launch
config, and the times that justify it. Files for another device or Triton version are
ignored (their configs may not even compile there). Without an explicit file the selector
looks in ``~/.cache/tokenspeed/kernels/<device>.json`` (``TOKENSPEED_KERNEL_CACHE_DIR``
moves the directory).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .device import DeviceInfo, triton_version

__all__ = [
    "SCHEMA_VERSION",
    "TunedEntry",
    "TuningTable",
    "clear_tuning",
    "default_tuning_path",
    "load_tuning_file",
    "loaded_tuning_tables",
    "tuned_entry",
    "tuning_generation",
]

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class TunedEntry:
    """The measured winner for one (op, shape bucket)."""

    kernel: str
    config: Mapping[str, Any]
    time_us: float | None = None
    default_time_us: float | None = None

    @property
    def speedup(self) -> float | None:
        """Untuned time over tuned time."""
        if self.time_us and self.default_time_us:
            return self.default_time_us / self.time_us
        return None

    def describe(self) -> str:
        """Short human text, e.g. ``1.31x over the untuned default``."""
        if self.speedup is None:
            return "from tuning file"
        return f"{self.speedup:.2f}x over the untuned default"


@dataclass
class TuningTable:
    """One tuning file's contents."""

    device: str
    device_slug: str
    triton: str | None
    entries: dict[str, dict[str, TunedEntry]] = field(default_factory=dict)
    path: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The on-disk form."""
        return {
            "schema": SCHEMA_VERSION,
            "device": self.device,
            "device_slug": self.device_slug,
            "triton": self.triton,
            "entries": {
                op: {
                    bucket: {
                        "kernel": e.kernel,
                        "config": dict(e.config),
                        "time_us": e.time_us,
                        "default_time_us": e.default_time_us,
                    }
                    for bucket, e in sorted(buckets.items())
                }
                for op, buckets in sorted(self.entries.items())
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], path: str | None = None) -> TuningTable:
        """Parse the on-disk form; raises ValueError on a wrong schema."""
        if data.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"{path}: tuning schema {data.get('schema')!r} != {SCHEMA_VERSION}")
        entries = {
            op: {
                bucket: TunedEntry(
                    kernel=e["kernel"],
                    config=dict(e.get("config", {})),
                    time_us=e.get("time_us"),
                    default_time_us=e.get("default_time_us"),
                )
                for bucket, e in buckets.items()
            }
            for op, buckets in data.get("entries", {}).items()
        }
        return cls(
            device=data["device"],
            device_slug=data["device_slug"],
            triton=data.get("triton"),
            entries=entries,
            path=path,
        )

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write atomically (a half-written file must never be read by a server)."""
        file = Path(path).expanduser()
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_suffix(file.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        tmp.replace(file)
        return file


_lock = threading.Lock()
_tables: dict[str, TuningTable] = {}
_default_tried: set[str] = set()
_generation = 0


def tuning_generation() -> int:
    """Bumped whenever tuned results change; selection caches key on it."""
    return _generation


def default_tuning_path(dev: DeviceInfo) -> Path:
    """``~/.cache/tokenspeed/kernels/<device>.json`` (or under TOKENSPEED_KERNEL_CACHE_DIR)."""
    root = os.environ.get("TOKENSPEED_KERNEL_CACHE_DIR")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "tokenspeed" / "kernels"
    return base / f"{dev.slug}.json"


def load_tuning_file(path: str | os.PathLike[str]) -> TuningTable:
    """Load a tuning file; it applies to the device it was measured on."""
    global _generation
    file = Path(path).expanduser()
    table = TuningTable.from_json(json.loads(file.read_text()), path=str(file))
    with _lock:
        _tables[table.device_slug] = table
        _generation += 1
    return table


def clear_tuning(*, skip_default_for: DeviceInfo | None = None) -> None:
    """Forget every loaded tuning table (tests use it; tuning starts from untuned choices,
    so it also stops ``skip_default_for``'s default file from being loaded)."""
    global _generation
    with _lock:
        _tables.clear()
        _default_tried.clear()
        if skip_default_for is not None:
            _default_tried.add(skip_default_for.slug)
        _generation += 1


def loaded_tuning_tables() -> list[dict[str, Any]]:
    """Summary of the loaded tables as plain data (for /get_server_info)."""
    with _lock:
        return [
            {
                "path": t.path,
                "device": t.device,
                "triton": t.triton,
                "usable": t.triton == triton_version(),
                "buckets": sum(len(b) for b in t.entries.values()),
            }
            for t in _tables.values()
        ]


def tuned_entry(dev: DeviceInfo, op: str, bucket: str) -> TunedEntry | None:
    """The tuned winner for ``op`` at ``bucket`` on ``dev``, if a usable file has one."""
    if dev.kind == "cpu":
        return None
    table = _tables.get(dev.slug)
    if table is None and dev.slug not in _default_tried:
        _default_tried.add(dev.slug)
        path = default_tuning_path(dev)
        if path.is_file():
            try:
                table = load_tuning_file(path)
            except (ValueError, KeyError, json.JSONDecodeError):
                table = None
    if table is None or table.triton != triton_version():
        return None
    return table.entries.get(op, {}).get(bucket)
