"""Inside the FP8 register decode's tile loop: how long each consumer group spends per tile
waiting for its slot, on the scores, on the softmax and on the values, in SM clock cycles.

    python3 benchmarks/mla/trace_regs.py --heads 16,32 --out FILE [--config JSON] [--ctas 4]

The 16-head kernel takes ~2 800 cycles a tile per SM where 95 % of the copy bandwidth leaves
~2 400; two consumer groups take the tiles in turn, so each has ~5 700 for its own. The
ablations (docs/mla-experiments.md) say what each part costs when removed; this says how long each
part of one group's tile takes while the other group runs beside it, which is what a design
with more groups, or with the work split differently between them, has to change.

The plan's register kernel (``cute_decode_fp8_regs.py``) is compiled as a subclass whose
``_scores`` and ``_values`` are wrapped in ``%clock64`` stamps by lane 0 of each consumer
warp, for the first ``--ctas`` CTAs, and the module's ``running_max`` is swapped for one
stamped the same way while it compiles; a stamp is a predicated store, not a branch (a
branch between a ``wgmma`` and its wait would make ptxas serialise them). Per tile and warp:
``scores_in`` (the slot is full and its scales read), ``scores_out`` (the scores are done and
the values' first runs loaded), ``max_in`` (scaled and masked), ``max_out`` (the group's row
max merged across its warps), ``values_in`` (``p^T`` stored and the output rescaled),
``values_out``. The phases are warp 0's; the four warps' spread where they reach the row max
says how long the first waits for the last at its barrier. Each stamp also stores
``%globaltimer``, from which the SM clock is read over the whole traced span.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

MAX_TILES = 64  # tiles traced per group
SCORES_IN, SCORES_OUT, MAX_IN, MAX_OUT, VALUES_IN, VALUES_OUT = range(6)
EVENTS = 6
WARPS = 4  # consumer warps a group
# [ctas, 2 groups, WARPS, MAX_TILES, EVENTS, (clock, ns)] int64
_TRACE: torch.Tensor | None = None


def stamper(address: int, ctas: int, max_tiles: int, events: int) -> Any:
    """``stamp(tile, event)`` for traced CuTe code: lane 0 of each consumer warp of the first
    ``ctas`` CTAs stores ``%clock64`` and ``%globaltimer`` at ``[cta, group, warp, tile,
    event]`` of the int64 buffer at ``address`` (``[ctas, 2, WARPS, max_tiles, events, 2]``),
    by a predicated store, not a branch (a branch between a ``wgmma`` and its wait would
    make ptxas serialise them)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32, Int64
    from cutlass.cutlass_dsl import dsl_user_op

    from tokenspeed.kernels.cute_ops.common import ptx_i32

    @dsl_user_op
    def stamp_if(at: Any, pred: Any, *, loc: Any = None, ip: Any = None) -> None:
        ptx = ("{ .reg .pred p; .reg .u64 c, g; setp.ne.s32 p, $2, 0; mov.u64 c, %clock64; "
               "mov.u64 g, %globaltimer; @p st.global.v2.u64 [$1], {c, g}; mov.u32 $0, 0; }")  # fmt: skip
        operands = [Int64(at).ir_value(loc=loc, ip=ip), Int32(pred).ir_value(loc=loc, ip=ip)]
        ptx_i32(ptx, "=r,l,r", operands, side_effects=True, loc=loc, ip=ip)

    def stamp(tile: Any, event: int) -> None:
        tid = Int32(cute.arch.thread_idx()[0])
        rb, split, b = cute.arch.block_idx()
        n_rb, n_split, _ = cute.arch.grid_dim()
        cta = (Int32(b) * Int32(n_split) + Int32(split)) * Int32(n_rb) + Int32(rb)
        group, warp = tid // 128, (tid // 32) % WARPS
        tile = Int32(tile)
        inside = cutlass.select_(cta < ctas, cutlass.select_(tile < max_tiles, 1, 0), 0)
        ok = cutlass.select_(tid % 32 == 0, Int32(inside), Int32(0))
        index = (((Int64(cta) * 2 + Int64(group)) * WARPS + Int64(warp)) * max_tiles
                 + Int64(tile)) * events + event  # fmt: skip
        stamp_if(Int64(address) + index * 16, ok)

    return stamp


def traced_class(base: type, address: int, ctas: int) -> tuple[type, Any]:
    """``base`` (the register kernel) with ``_scores`` and ``_values`` stamped into the buffer
    at ``address`` for its first ``ctas`` CTAs, and the stand-in for the module's
    ``running_max`` that stamps around the row max (installed by ``trace_regs``)."""
    from tokenspeed.mla.cute_decode import running_max

    stamp_tile = stamper(address, ctas, MAX_TILES, EVENTS)

    def stamp(state: Any, event: int) -> None:
        stamp_tile(state.count // 2, event)  # group g's i-th tile is the split's 2 i + g

    # the tile's slot state, for the row max's stamps (the DSL traces the body once, in order)
    current: dict[str, Any] = {}

    def traced_running_max(*args: Any) -> Any:
        stamp(current["state"], MAX_IN)
        result = running_max(*args)
        stamp(current["state"], MAX_OUT)
        return result

    class Traced(base):  # type: ignore[misc, valid-type]
        def _scores(self, *args: Any) -> Any:
            state = args[-1]
            current["state"] = state
            stamp(state, SCORES_IN)
            result = super()._scores(*args)
            stamp(state, SCORES_OUT)
            return result

        def _values(self, *args: Any) -> Any:
            state = args[-1]
            stamp(state, VALUES_IN)
            result = super()._values(*args)
            stamp(state, VALUES_OUT)
            return result

    Traced.__name__ = f"Traced{base.__name__}"
    return Traced, traced_running_max


PHASES = {  # name: (from event, to event) within one tile
    "scores": (SCORES_IN, SCORES_OUT),
    "scale_mask": (SCORES_OUT, MAX_IN),
    "row_max": (MAX_IN, MAX_OUT),  # includes the wait for the group's other warps
    "probs_rescale": (MAX_OUT, VALUES_IN),  # exp2, p^T, its barrier, the output's rescale
    "values": (VALUES_IN, VALUES_OUT),
}


def summarise(trace: torch.Tensor) -> dict[str, Any]:
    """Medians over the traced CTAs and their middle tiles (two at each end left out: the ring
    fills and drains there) of each phase of a group's tile as its warp 0 saw it, in cycles;
    the spread of the group's four warps where they reach the row max (last minus first: what
    the first waits at its barrier for); and the SM clock (``trace``: [ctas, 2, WARPS,
    MAX_TILES, EVENTS, 2]; 0 where nothing was stamped)."""
    clock, ns = trace[..., 0].double(), trace[..., 1].double()
    ghz = []
    for cta in range(trace.shape[0]):
        for group in range(2):
            seen = ns[cta, group, 0] > 0
            if int(seen.sum()) > 8:
                c, t = clock[cta, group, 0][seen], ns[cta, group, 0][seen]
                ghz.append(float((c.max() - c.min()) / (t.max() - t.min())))
    out: dict[str, Any] = {"sm_ghz": round(statistics.median(ghz), 3) if ghz else None}
    for group in range(2):
        phases: dict[str, list[float]] = {k: [] for k in ("slot_wait", *PHASES, "period")}
        spread: list[float] = []
        for cta in range(trace.shape[0]):
            t = clock[cta, group, 0]
            tiles = int((t[:, SCORES_IN] > 0).sum())
            for i in range(2, tiles - 2):
                for name, (a, b) in PHASES.items():
                    phases[name].append(float(t[i, b] - t[i, a]))
                phases["slot_wait"].append(float(t[i + 1, SCORES_IN] - t[i, VALUES_OUT]))
                phases["period"].append(float(t[i + 1, SCORES_IN] - t[i, SCORES_IN]))
                arrive = clock[cta, group, :, i, MAX_IN]
                if bool((arrive > 0).all()):
                    spread.append(float(arrive.max() - arrive.min()))
        if phases["period"]:
            out[f"group{group}"] = {
                "tiles": len(phases["period"]),
                **{f"{k}_cycles": round(statistics.median(v)) for k, v in phases.items()},
                "row_max_arrival_spread_cycles": round(statistics.median(spread))
                if spread
                else None,
            }
    return out


def launch_traced(heads: int, fp8: str, config: dict[str, Any], trace: torch.Tensor,
                  install: Any) -> torch.Tensor:  # fmt: skip
    """The stamps of one decode at ``heads`` heads (the sweep's batch and length) with every
    kernel built passed through ``install`` (``timeline_decode.decode_kernels_as``): launched
    twice, to compile and then on a warm machine, the second launch's ``trace`` on the CPU."""
    from sweep_decode import BATCH, KV_LEN, SCALE, _inputs
    from timeline_decode import decode_kernels_as

    from tokenspeed.mla import cute_decode

    with decode_kernels_as(install):
        x = _inputs(heads, 1, fp8=fp8)
        out = torch.empty(BATCH, 1, heads, 512, dtype=torch.bfloat16, device="cuda")
        for _ in range(2):
            trace.zero_()
            cute_decode.mla_decode(x["q"], x["cache"], x["tables"], x["seq"], SCALE, out=out,
                                   kv_scale=x["scale"], max_seq_len=KV_LEN, config=config)  # fmt: skip
            torch.cuda.synchronize()
    stamps = trace.cpu()
    if not bool((stamps > 0).any()):
        raise SystemExit(f"{heads} heads: no stamps written")
    return stamps


def trace_regs(heads: int, fp8: str, config: dict[str, Any] | None, ctas: int) -> dict[str, Any]:
    """One traced launch of the FP8 register decode at ``heads`` heads, summarised."""
    global _TRACE
    from tokenspeed.mla import cute_decode_fp8_regs as regs

    _TRACE = torch.zeros(ctas, 2, WARPS, MAX_TILES, EVENTS, 2, dtype=torch.int64, device="cuda")

    def traced(kernel: Any, spec: dict[str, Any]) -> Any:
        if spec["layout"] != "regs" or not spec["fp8"]:
            raise SystemExit("traces the FP8 register kernel only (16 or 32 rows, FP8 cache)")
        kernel.__class__, regs.running_max = traced_class(type(kernel), _TRACE.data_ptr(), ctas)
        return kernel

    config = {"layout": "regs", **(config or {})}
    shipped_max = regs.running_max
    try:
        trace = launch_traced(heads, fp8, config, _TRACE, traced)
    finally:
        regs.running_max = shipped_max
    return {"heads": heads, "fp8": fp8, "config": config, **summarise(trace)}


def trace_cli(argv: list[str] | None, doc: str, heads: str, trace_one: Any) -> int:
    """A tracer's command line: ``trace_one(heads, fp8, config, ctas)`` per ``--heads``
    entry, each row printed as it comes and all of them written to ``--out``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--heads", default=heads)
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
    for h in (int(h) for h in args.heads.split(",")):
        row = trace_one(h, args.fp8, args.config, args.ctas)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Trace the 16/32-row kernel (16 and 32 heads unless told)."""
    return trace_cli(argv, __doc__, "16,32", trace_regs)


if __name__ == "__main__":
    raise SystemExit(main())
