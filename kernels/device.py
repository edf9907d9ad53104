"""What the selector needs to know about a device, looked up once per device."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from dataclasses import dataclass

import torch

__all__ = [
    "DeviceInfo",
    "capture_stream",
    "device_info",
    "triton_available",
    "triton_interpret",
    "triton_version",
]


@dataclass(frozen=True)
class DeviceInfo:
    """A device as the registry sees it.

    ``kind`` is the torch device type ("cpu", "cuda"); ``vendor`` is "nvidia", "amd" or
    "cpu"; ``compute`` the CUDA compute capability (major, minor), or None.
    """

    kind: str
    vendor: str
    name: str
    compute: tuple[int, int] | None = None
    num_sms: int = 0

    @property
    def slug(self) -> str:
        """A file-name-safe device name, e.g. ``nvidia-h200``."""
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-") or self.kind


@functools.cache
def _cached_device_info(kind: str, index: int) -> DeviceInfo:
    if kind == "cuda":
        props = torch.cuda.get_device_properties(index)
        vendor = "amd" if getattr(torch.version, "hip", None) else "nvidia"
        return DeviceInfo(
            kind="cuda",
            vendor=vendor,
            name=props.name,
            compute=(props.major, props.minor),
            num_sms=props.multi_processor_count,
        )
    return DeviceInfo(kind=kind, vendor=kind, name=kind)


_BY_DEVICE: dict[torch.device, DeviceInfo] = {}


def device_info(device: torch.device | str) -> DeviceInfo:
    """The DeviceInfo of ``device`` (cached per device).

    Every op call asks, so a ``torch.device`` with its index known (or a CPU) is answered from
    a dict before any parsing.
    """
    if isinstance(device, torch.device):
        found = _BY_DEVICE.get(device)
        if found is not None:
            return found
        if device.type == "cpu" or device.index is not None:
            found = _BY_DEVICE[device] = _cached_device_info(device.type, device.index or 0)
            return found
    device = torch.device(device)
    index = device.index
    if device.type == "cuda" and index is None:
        index = torch.cuda.current_device()
    return _cached_device_info(device.type, index or 0)


_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}


def capture_stream(device: torch.device | str | None = None) -> torch.cuda.Stream:
    """The one side stream this process warms up and captures CUDA graphs on, per device.

    cuBLAS keeps a workspace per (handle, stream) until the process exits (32 MiB on Hopper)
    and a graph captured on a stream embeds that stream's workspace. A fresh stream per
    capture left one workspace behind every capture (measured on an H100: 33.5 MB per deleted
    plain engine, 0.1 GiB per MTP engine with its three graph runners); one shared stream
    holds one, and since it is never freed every graph that embeds it stays valid (torch's
    own ``torch.cuda.graph`` likewise captures every graph on one default stream).
    """
    dev = torch.device("cuda") if device is None else torch.device(device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    stream = _CAPTURE_STREAMS.get(index)
    if stream is None:
        stream = _CAPTURE_STREAMS[index] = torch.cuda.Stream(index)
    return stream


@functools.cache
def triton_available() -> bool:
    """Whether the ``triton`` package can be imported (it is not imported here)."""
    return importlib.util.find_spec("triton") is not None


def triton_interpret() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


@functools.cache
def triton_version() -> str | None:
    """The installed Triton version, read from package metadata without importing it."""
    if not triton_available():
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("triton")
    except PackageNotFoundError:
        return None
