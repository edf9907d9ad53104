"""Inside the pairs decode's tile loop: when each consumer group of a few CTAs enters each
pair, waits for and issues each part's scores, issues each values product, hands ``P`` over
and releases each part, pair by pair.

    python3 benchmarks/mla/trace_pairs.py --heads 64,128 --out FILE [--config JSON] [--ctas 4]

``timeline_decode.py`` times whole CTAs; this opens one up. What it answers: how long a group
waits for a part to land (``issued - wait`` of a scores part: the full-barrier wait, the
issue itself is a few instructions), how long after a pair's start ``P_A`` / ``P_B`` are
there for the other group's product, and when each part is released, i.e. the hold time
that sets the loads' pace (docs/mla-experiments.md). The pairs kernel (the plan's, or
``--config``'s) is compiled as a subclass whose pair bodies and pieces are wrapped in
``%globaltimer`` stamps by the first thread of each group, for the first ``--ctas`` CTAs. A stamp
is a predicated store, not a branch: a branch between a ``wgmma`` and its wait would make ptxas
serialise every ``wgmma`` of the kernel, and then the trace would time another kernel.
``%globaltimer`` ticks every 256 ns on the H200 seen here, so single events are coarse; the medians
over pairs and CTAs are what to read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

MAX_PAIRS = 64  # pairs traced per group (4096 tokens in 32-token tiles)
# A group's stamps in one pair; scores and releases are filed under the pair of the tile they
# belong to (a tile's scores are issued at the end of the pair before it).
BODY_IN, BODY_OUT = 0, 1
SCORES_WAIT, SCORES_ISSUED = 2, 5  # + part (lo, hi or mid, rope)
VALUES = 8  # + tile (A, B): a values product issued, its P there
HAND_IN, HAND_OUT = 10, 12  # + tile: P written to shared memory and signalled
RELEASE = 14  # + 3 * tile + part
EVENTS = 20
NAMES = {
    BODY_IN: "body_in", BODY_OUT: "body_out",
    **{SCORES_WAIT + k: f"scores_wait_{n}" for k, n in enumerate(("lo", "hi", "rope"))},
    **{SCORES_ISSUED + k: f"scores_issued_{n}" for k, n in enumerate(("lo", "hi", "rope"))},
    VALUES: "values_A", VALUES + 1: "values_B", HAND_IN: "hand_in_A", HAND_IN + 1: "hand_in_B",
    HAND_OUT: "hand_out_A", HAND_OUT + 1: "hand_out_B",
    **{RELEASE + 3 * w + k: f"release_{t}_{n}" for w, t in enumerate("AB")
       for k, n in enumerate(("lo", "hi", "rope"))},
}  # fmt: skip
_TRACE: torch.Tensor | None = None  # [ctas, 2 groups, MAX_PAIRS, EVENTS] int64, ns


def traced_class(base: type, address: int, ctas: int) -> type:
    """``base`` (the pairs kernel) with its pair bodies and pieces stamped into the buffer at
    ``address`` for its first ``ctas`` CTAs."""
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32, Int64
    from cutlass.cutlass_dsl import dsl_user_op
    from timeline_decode import globaltimer_op

    from tokenspeed.kernels.cute_ops.common import ptx_i32

    now = globaltimer_op()

    @dsl_user_op
    def store_if(at: Any, value: Any, pred: Any, *, loc: Any = None, ip: Any = None) -> None:
        ptx = ("{ .reg .pred p; setp.ne.s32 p, $3, 0; @p st.global.u64 [$1], $2; "
               "mov.u32 $0, 0; }")  # fmt: skip
        operands = [Int64(at).ir_value(loc=loc, ip=ip), Int64(value).ir_value(loc=loc, ip=ip),
                    Int32(pred).ir_value(loc=loc, ip=ip)]  # fmt: skip
        ptx_i32(ptx, "=r,l,l,r", operands, side_effects=True, loc=loc, ip=ip)

    def stamp(pair: Any, slot: int) -> None:
        tid = Int32(cute.arch.thread_idx()[0])
        rb, split, b = cute.arch.block_idx()
        n_rb, n_split, _ = cute.arch.grid_dim()
        cta = (Int32(b) * Int32(n_split) + Int32(split)) * Int32(n_rb) + Int32(rb)
        group = tid // 128
        pair = Int32(pair)
        ok = both(tid % 128 == 0, both(cta < ctas, pair < MAX_PAIRS) != 0)
        index = ((Int64(cta) * 2 + Int64(group)) * MAX_PAIRS + Int64(pair)) * EVENTS + slot
        store_if(Int64(address) + index * 8, now(), ok)

    def both(a: Any, b: Any) -> Any:
        """``a and b`` as an Int32 0 / 1, selected, not branched on."""
        return cutlass.select_(a, cutlass.select_(b, Int32(1), Int32(0)), Int32(0))

    class Traced(base):  # type: ignore[misc, valid-type]
        def _pair_group0(self, c: Any, *args: Any) -> Any:
            return self._body("_pair_group0", c, *args)

        def _pair_group1(self, c: Any, *args: Any) -> Any:
            return self._body("_pair_group1", c, *args)

        def _body(self, method: str, c: Any, acc_s: Any, acc_o: Any, m_run: Any, l_own: Any,
                  r_pa: Any, r_p: Any, p: Any, has_b: Any, has_next: Any) -> Any:  # fmt: skip
            c.trace_pair = p  # for the pieces that are not told the pair
            stamp(p, BODY_IN)
            result = getattr(super(), method)(c, acc_s, acc_o, m_run, l_own, r_pa, r_p, p,
                                              has_b, has_next)  # fmt: skip
            stamp(p, BODY_OUT)
            return result

        def _issue_scores_part(self, c: Any, acc_s: Any, which: Any, pair: Any, part: int,
                               first: Any) -> Any:  # fmt: skip
            stamp(pair, SCORES_WAIT + part)
            result = super()._issue_scores_part(c, acc_s, which, pair, part, first)
            stamp(pair, SCORES_ISSUED + part)
            return result

        def _issue_values(self, c: Any, acc_o: Any, r_pa: Any, own: Any, pair: Any,
                          which: int, half: Any) -> Any:  # fmt: skip
            stamp(pair, VALUES + which)
            return super()._issue_values(c, acc_o, r_pa, own, pair, which, half)

        def _hand_over(self, c: Any, r_p: Any, which: int, bar: Any) -> Any:
            stamp(c.trace_pair, HAND_IN + which)
            result = super()._hand_over(c, r_p, which, bar)
            stamp(c.trace_pair, HAND_OUT + which)
            return result

        def _release(self, c: Any, pair: Any, which: int, part: int) -> Any:
            stamp(pair, RELEASE + 3 * which + part)
            return super()._release(c, pair, which, part)

    Traced.__name__ = f"Traced{base.__name__}"
    return Traced


def summarise(trace: torch.Tensor) -> dict[str, Any]:
    """Medians over the traced CTAs and their middle pairs (the first two and the last two
    left out: the ring fills and drains there) of each stamp's time after the group's own
    pair start, of each scores part's full-barrier wait, and of the pair's length (``trace``:
    [ctas, 2, MAX_PAIRS, EVENTS], ns; 0 where nothing was stamped)."""
    out: dict[str, Any] = {}
    for group in range(2):
        rows = []
        for cta in range(trace.shape[0]):
            t = trace[cta, group].double()
            pairs = int((t[:, BODY_IN] > 0).sum())
            rows += [t[p] for p in range(2, pairs - 2)]
        if not rows:
            continue
        stats: dict[str, float] = {}
        starts = [r[BODY_IN] for r in rows]
        for slot, name in NAMES.items():
            # (a tile's scores are issued before its pair starts: negative times)
            values = [float(r[slot] - s) / 1e3 for r, s in zip(rows, starts, strict=True)
                      if r[slot] > 0]  # fmt: skip
            if values and slot != BODY_IN:
                stats[f"{name}_us"] = round(statistics.median(values), 3)
        for part in range(3):
            waits = [float(r[SCORES_ISSUED + part] - r[SCORES_WAIT + part]) / 1e3 for r in rows
                     if r[SCORES_WAIT + part] > 0]  # fmt: skip
            if waits:
                stats[f"scores_full_wait_{('lo', 'hi', 'rope')[part]}_us"] = round(
                    statistics.median(waits), 3
                )
        out[f"group{group}"] = {"pairs": len(rows), **stats}
    return out


def trace_pairs(heads: int, config: dict[str, Any] | None, ctas: int) -> dict[str, Any]:
    """One traced launch of the pairs decode at ``heads`` heads, summarised, with the stamps."""
    global _TRACE
    from sweep_decode import BATCH, KV_LEN, SCALE, _inputs
    from timeline_decode import decode_kernels_as

    from tokenspeed.mla import cute_decode

    _TRACE = torch.zeros(ctas, 2, MAX_PAIRS, EVENTS, dtype=torch.int64, device="cuda")

    def traced(kernel: Any, spec: dict[str, Any]) -> Any:
        if spec["layout"] != "pairs" or spec["fp8"]:
            raise SystemExit("traces the pairs kernel only (64+ rows per request, bf16)")
        kernel.__class__ = traced_class(type(kernel), _TRACE.data_ptr(), ctas)
        return kernel

    with decode_kernels_as(traced):
        x = _inputs(heads, 1)
        out = torch.empty(BATCH, 1, heads, 512, dtype=torch.bfloat16, device="cuda")
        for _ in range(2):  # compile, then the traced launch on a warm machine
            _TRACE.zero_()
            cute_decode.mla_decode(x["q"], x["cache"], x["tables"], x["seq"], SCALE, out=out,
                                   max_seq_len=KV_LEN, config=config)  # fmt: skip
            torch.cuda.synchronize()
        trace = _TRACE.cpu()
        if not bool((trace > 0).any()):
            raise SystemExit(
                f"{heads} heads: no stamps written (is the plan's kernel the pairs one?)"
            )
        t0 = int(trace[trace > 0].min())
        return {
            "heads": heads,
            "config": config,
            **summarise(trace),
            "stamps_ns_from_first": torch.where(trace > 0, trace - t0, 0).tolist(),
            "events": {str(k): v for k, v in NAMES.items()},
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", default="64,128")
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
        row = trace_pairs(heads, args.config, args.ctas)
        print(json.dumps({k: v for k, v in row.items() if k not in ("stamps_ns_from_first",
                                                                    "events")}))  # fmt: skip
        rows.append(row)
    if args.out:
        args.out.write_text(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
