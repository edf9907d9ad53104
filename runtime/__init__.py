"""TokenSpeed's execution plane: model loading, KV pools, attention, sampling, the engine loop.

Importing this package is cheap (no torch): ``LLM``, ``SamplingParams`` and ``RequestOutput``
are loaded on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenspeed.runtime.llm import LLM
    from tokenspeed.runtime.outputs import CompletionOutput, RequestOutput
    from tokenspeed.runtime.sampling.params import SamplingParams

_LAZY = {
    "LLM": "tokenspeed.runtime.llm",
    "SamplingParams": "tokenspeed.runtime.sampling.params",
    "RequestOutput": "tokenspeed.runtime.outputs",
    "CompletionOutput": "tokenspeed.runtime.outputs",
}

__all__ = ["LLM", "CompletionOutput", "RequestOutput", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tokenspeed.runtime' has no attribute {name!r}")
