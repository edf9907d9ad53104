"""Programmatic dependent launch (PDL, SM90+) for the Triton kernels that opt in.

A kernel launched with PDL may be scheduled while the kernel before it in the stream is still
running; ``griddepcontrol.wait`` then holds it until that kernel has finished and its writes
are visible. Waiting before the first global access keeps stream order exact whatever the
neighbours do, so the only thing gained is the launch and ramp-up of the grid: its programs
are already resident when the previous kernel ends. ``griddepcontrol.launch_dependents``
lets the *next* kernel do the same to us (it has no effect unless that kernel is launched
with PDL too).

Config key ``pdl``: ``"early"`` (wait, then let the next kernel launch at once), ``"exit"``
(wait; the next kernel may launch when every program has exited) or ``""`` / false (a plain
launch); absent means the kernel's default (``"early"`` for the one-pass MoE, which measured
0.2-1.0 us faster at one token in seven of seven H200 runs; plain for decode, where it
changed nothing). The interpreter and pre-Hopper devices always get a plain launch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

PDL_MODES = ("early", "exit")


def pdl_mode(cfg: Mapping[str, Any], device: torch.device, default: str = "") -> str:
    """The ``pdl`` mode a launch on ``device`` uses (``default`` where ``cfg`` names none):
    ``""`` where PDL does not apply."""
    mode = cfg.get("pdl", default) or ""
    if mode and mode not in PDL_MODES:
        raise ValueError(f"pdl={mode!r}; expected one of {PDL_MODES} or nothing")
    if not mode or device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9:
        return ""
    return str(mode)


def pdl_launch_options(mode: str) -> dict[str, Any]:
    """Extra launch keywords for ``mode`` (Triton's ``launch_pdl``)."""
    return {"launch_pdl": True} if mode else {}


@triton.jit
def pdl_prologue(PDL_WAIT: tl.constexpr, PDL_TRIGGER: tl.constexpr):
    """First statement of a PDL kernel: wait for the previous kernel, then (``early``) let
    the next one launch."""
    if PDL_WAIT:
        tl.extra.cuda.gdc_wait()
    if PDL_TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()


def pdl_constexprs(mode: str) -> dict[str, bool]:
    """The prologue's compile-time switches for ``mode``."""
    return {"PDL_WAIT": bool(mode), "PDL_TRIGGER": mode == "early"}
