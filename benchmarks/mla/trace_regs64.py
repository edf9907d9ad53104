"""Inside the 64-row FP8 register decode's tile loop: how long each consumer group spends per
tile of its own on the scores, waiting for the other group's publication, on the softmax and
on the two values products, in SM clock cycles.

    python3 benchmarks/mla/trace_regs64.py --heads 128 --out FILE [--config JSON] [--ctas 4]

From L2 the kernel takes ~4 700 cycles a tile where its 68 wgmmas need ~2 580 (H100,
docs/mla-experiments.md). The groups take turns scoring, and each tile's softmax waits for the
previous tile's max, so the question is how much of a group's period is that wait and how much is
its own work; this answers it per phase.

``cute_decode_fp8_regs64.py``'s kernel is compiled as a subclass whose ``_scores``,
``_softmax`` and ``_values_half`` are wrapped in stamps (``trace_regs.stamper``: lane 0 of
each consumer warp, first ``--ctas`` CTAs), indexed by the split's tile: a group stamps
``scores_in/out`` and ``softmax_in/out`` on the tiles it scores, ``values_in/out`` on every
tile (the other group's tile first in its loop, then its own). Per own tile ``u`` of a group:
``scores``, ``wait`` (scores done to the other group's tile's values: the scale and mask, and
the other group's publication of ``u - 1``), ``values_other`` (tile ``u - 1``), ``softmax``
(to its publication), ``values_own`` and ``period`` (to the scores of ``u + 2``).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

import torch

MAX_TILES = 128  # of the split, both groups' (stamped by tile number)
SCORES_IN, SCORES_OUT, SOFTMAX_IN, SOFTMAX_OUT, VALUES_IN, VALUES_OUT = range(6)
EVENTS = 6
WARPS = 4


def traced_class(base: type, address: int, ctas: int) -> type:
    """``base`` (the 64-row register kernel) with its phases stamped into the buffer at
    ``address`` for its first ``ctas`` CTAs."""
    from trace_regs import stamper

    stamp = stamper(address, ctas, MAX_TILES, EVENTS)

    def stamped(name: str, begin: int, end: int) -> Any:
        """``base``'s method ``name`` between two stamps, at the tile of its last argument
        (the slot state)."""

        def method(self: Any, *args: Any) -> Any:
            stamp(args[-1].count, begin)
            result = getattr(super(traced, self), name)(*args)
            stamp(args[-1].count, end)
            return result

        return method

    traced = type(f"Traced{base.__name__}", (base,), {
        "_scores": stamped("_scores", SCORES_IN, SCORES_OUT),
        "_softmax": stamped("_softmax", SOFTMAX_IN, SOFTMAX_OUT),
        "_values_half": stamped("_values_half", VALUES_IN, VALUES_OUT),
    })  # fmt: skip
    return traced


def summarise(trace: torch.Tensor) -> dict[str, Any]:
    """Medians over the traced CTAs and their middle tiles (two at each end left out) of each
    phase of a group's own tile as its warp 0 saw it, in cycles, and the SM clock
    (``trace``: [ctas, 2, WARPS, MAX_TILES, EVENTS, 2]; 0 where nothing was stamped)."""
    clock, ns = trace[..., 0].double(), trace[..., 1].double()
    ghz = []
    for cta in range(trace.shape[0]):
        for group in range(2):
            seen = ns[cta, group, 0] > 0
            if int(seen.sum()) > 8:
                c, t = clock[cta, group, 0][seen], ns[cta, group, 0][seen]
                ghz.append(float((c.max() - c.min()) / (t.max() - t.min())))
    out: dict[str, Any] = {"sm_ghz": round(statistics.median(ghz), 3) if ghz else None}
    names = ("scores", "wait", "values_other", "softmax", "values_own", "period")
    for group in range(2):
        phases: dict[str, list[float]] = {k: [] for k in names}
        for cta in range(trace.shape[0]):
            t = clock[cta, group, 0]  # [tile, event]
            own = [u for u in range(group, MAX_TILES, 2) if t[u, SCORES_IN] > 0]
            for u in own[2:-2]:
                if u + 2 >= MAX_TILES or t[u + 2, SCORES_IN] <= 0 or t[u - 1, VALUES_IN] <= 0:
                    continue
                phases["scores"].append(float(t[u, SCORES_OUT] - t[u, SCORES_IN]))
                phases["wait"].append(float(t[u - 1, VALUES_IN] - t[u, SCORES_OUT]))
                phases["softmax"].append(float(t[u, SOFTMAX_OUT] - t[u, SOFTMAX_IN]))
                phases["values_other"].append(float(t[u - 1, VALUES_OUT] - t[u - 1, VALUES_IN]))
                phases["values_own"].append(float(t[u, VALUES_OUT] - t[u, VALUES_IN]))
                phases["period"].append(float(t[u + 2, SCORES_IN] - t[u, SCORES_IN]))
        if phases["period"]:
            out[f"group{group}"] = {
                "tiles": len(phases["period"]),
                **{f"{k}_cycles": round(statistics.median(v)) for k, v in phases.items()},
            }
    return out


def trace_regs64(heads: int, fp8: str, config: dict[str, Any] | None, ctas: int) -> dict[str, Any]:
    """One traced launch of the 64-row FP8 register decode at ``heads`` heads, summarised."""
    from trace_regs import launch_traced

    buffer = torch.zeros(ctas, 2, WARPS, MAX_TILES, EVENTS, 2, dtype=torch.int64, device="cuda")

    def traced(kernel: Any, spec: dict[str, Any]) -> Any:
        if spec["layout"] != "regs" or spec["rows"] != 64 or not spec["fp8"]:
            raise SystemExit("traces the 64-row FP8 register kernel only")
        kernel.__class__ = traced_class(type(kernel), buffer.data_ptr(), ctas)
        return kernel

    config = {"layout": "regs", "rows": 64, **(config or {})}
    trace = launch_traced(heads, fp8, config, buffer, traced)
    return {"heads": heads, "fp8": fp8, "config": config, **summarise(trace)}


def main(argv: list[str] | None = None) -> int:
    """Trace the 64-row kernel (128 heads unless told); the CLI is ``trace_regs``'s."""
    sys.path.insert(0, str(Path(__file__).parent))
    from trace_regs import trace_cli

    return trace_cli(argv, __doc__, "128", trace_regs64)


if __name__ == "__main__":
    raise SystemExit(main())
