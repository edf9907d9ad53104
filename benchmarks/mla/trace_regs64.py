"""Inside the 64-row FP8 register decode's tile loop: how long each consumer group spends per
tile of its own on the scores, waiting for the other group's publication, on the softmax and
on the two values products, in SM clock cycles.

    python3 benchmarks/mla/trace_regs64.py --heads 128 --out FILE [--config JSON] [--ctas 4]

From L2 the kernel takes ~4 700 cycles a tile where its 68 wgmmas need ~2 580 (H100,
docs/mla.md). The groups take turns scoring, and each tile's softmax waits for the previous
tile's max, so the question is how much of a group's period is that wait and how much is
its own work; this answers it per phase.

``cute_decode_fp8_regs64.py``'s kernel is compiled as a subclass whose ``_scores``,
``_softmax`` and ``_values_half`` are wrapped in stamps (``trace_regs.stamper``: lane 0 of
each consumer warp, first ``--ctas`` CTAs), indexed by the split's tile: a group stamps
``scores_in/out`` and ``softmax_in/out`` on the tiles it scores, ``values_in/out`` on every
tile (the other group's tile first in its loop, then its own). Per own tile ``u`` of a group:
``scores``, ``wait`` (scores done to softmax start: the other group's publication of ``u -
1`` and the buffers' release), ``softmax`` (to its publication), ``values_other`` (tile ``u
- 1``), ``values_own`` and ``period`` (to the scores of ``u + 2``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

MAX_TILES = 128  # of the split, both groups' (stamped by tile number)
SCORES_IN, SCORES_OUT, SOFTMAX_IN, SOFTMAX_OUT, VALUES_IN, VALUES_OUT = range(6)
EVENTS = 6
WARPS = 4
_TRACE: torch.Tensor | None = None


def traced_class(base: type, address: int, ctas: int) -> type:
    """``base`` (the 64-row register kernel) with its phases stamped into the buffer at
    ``address`` for its first ``ctas`` CTAs."""
    from trace_regs import stamper

    stamp = stamper(address, ctas, MAX_TILES, EVENTS)

    class Traced(base):  # type: ignore[misc, valid-type]
        def _scores(self, *args: Any) -> Any:
            state = args[-1]
            stamp(state.count, SCORES_IN)
            result = super()._scores(*args)
            stamp(state.count, SCORES_OUT)
            return result

        def _softmax(self, *args: Any) -> Any:
            state = args[-1]
            stamp(state.count, SOFTMAX_IN)
            result = super()._softmax(*args)
            stamp(state.count, SOFTMAX_OUT)
            return result

        def _values_half(self, *args: Any) -> Any:
            state = args[-1]
            stamp(state.count, VALUES_IN)
            result = super()._values_half(*args)
            stamp(state.count, VALUES_OUT)
            return result

    Traced.__name__ = f"Traced{base.__name__}"
    return Traced


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
    names = ("scores", "wait", "softmax", "values_other", "values_own", "period")
    for group in range(2):
        phases: dict[str, list[float]] = {k: [] for k in names}
        for cta in range(trace.shape[0]):
            t = clock[cta, group, 0]  # [tile, event]
            own = [u for u in range(group, MAX_TILES, 2) if t[u, SCORES_IN] > 0]
            for u in own[2:-2]:
                if u + 2 >= MAX_TILES or t[u + 2, SCORES_IN] <= 0 or t[u - 1, VALUES_IN] <= 0:
                    continue
                phases["scores"].append(float(t[u, SCORES_OUT] - t[u, SCORES_IN]))
                phases["wait"].append(float(t[u, SOFTMAX_IN] - t[u, SCORES_OUT]))
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
    global _TRACE
    from sweep_decode import BATCH, KV_LEN, SCALE, _inputs
    from timeline_decode import decode_kernels_as

    from tokenspeed.mla import cute_decode

    _TRACE = torch.zeros(ctas, 2, WARPS, MAX_TILES, EVENTS, 2, dtype=torch.int64, device="cuda")

    def traced(kernel: Any, spec: dict[str, Any]) -> Any:
        if spec["layout"] != "regs" or spec["rows"] != 64 or not spec["fp8"]:
            raise SystemExit("traces the 64-row FP8 register kernel only")
        kernel.__class__ = traced_class(type(kernel), _TRACE.data_ptr(), ctas)
        return kernel

    config = {"layout": "regs", "rows": 64, **(config or {})}
    with decode_kernels_as(traced):
        x = _inputs(heads, 1, fp8=fp8)
        out = torch.empty(BATCH, 1, heads, 512, dtype=torch.bfloat16, device="cuda")
        for _ in range(2):  # compile, then the traced launch on a warm machine
            _TRACE.zero_()
            cute_decode.mla_decode(x["q"], x["cache"], x["tables"], x["seq"], SCALE, out=out,
                                   kv_scale=x["scale"], max_seq_len=KV_LEN, config=config)  # fmt: skip
            torch.cuda.synchronize()
        trace = _TRACE.cpu()
    if not bool((trace > 0).any()):
        raise SystemExit(f"{heads} heads: no stamps written")
    return {"heads": heads, "fp8": fp8, "config": config, **summarise(trace)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", default="128")
    parser.add_argument("--fp8", default="token", choices=("token", "tensor"))
    parser.add_argument("--config", type=json.loads, default=None, help="plan keys, as JSON")
    parser.add_argument("--ctas", type=int, default=4, help="CTAs traced (the first ones)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).parent))
    rows = []
    for heads in (int(h) for h in args.heads.split(",")):
        row = trace_regs64(heads, args.fp8, args.config, args.ctas)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
