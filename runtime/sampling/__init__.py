"""Sampling: parameters, per-slot state and the batched sampler.

``SamplingParams`` imports without torch (the HTTP process builds them); the rest loads lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokenspeed.runtime.sampling.params import SamplingParams

if TYPE_CHECKING:
    from tokenspeed.runtime.sampling.sampler import SampleOutput, sample
    from tokenspeed.runtime.sampling.state import SamplingBatch, SamplingState

_LAZY = {
    "SampleOutput": "tokenspeed.runtime.sampling.sampler",
    "sample": "tokenspeed.runtime.sampling.sampler",
    "SamplingBatch": "tokenspeed.runtime.sampling.state",
    "SamplingState": "tokenspeed.runtime.sampling.state",
}

__all__ = ["SampleOutput", "SamplingBatch", "SamplingParams", "SamplingState", "sample"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tokenspeed.runtime.sampling' has no attribute {name!r}")
