"""Per-CTA timeline of the CuTe MLA decode at FlashMLA's shapes: when each CTA's consumers
start, when each consumer group enters and leaves the epilogue, when the producer issues its
last load, and on which SM.

    python3 benchmarks/mla/timeline_decode.py --heads 32,64 --out FILE [--config JSON] [--reps 3]

A profiler averages over the CTAs; this shows the spread between them and what happens at
the end of each, which is where two of the decode's largest fixes were (docs/mla-experiments.md: the
32-row epilogue's division per element, the 64-row epilogue's stores). The kernel the plan
picks (per-request grid, bf16 or FP8) is compiled as a subclass whose methods wrap the
shipped ones with ``%globaltimer`` stamps, so no kernel body is copied; the stamp buffer's
address is compiled in as a constant (one buffer per process). Times are in microseconds
from the first CTA's consumer start; ``%globaltimer`` ticks every 32 ns or coarser (256 ns on
the H200 here).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

SLOTS = 8  # per CTA: the stamps below
START, EPI0_IN, EPI0_OUT, EPI1_IN, EPI1_OUT, SM, LAST_LOAD = range(7)
_CLOCK: torch.Tensor | None = None  # the stamp buffer, [CTAs, SLOTS] int64


def globaltimer_op() -> Callable[[], Any]:
    """A device op that reads ``%globaltimer`` (ns) as an Int64, for stamping kernels (made on
    first use: importing this module needs no CuTe DSL)."""
    from cutlass import Int64
    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import T, dsl_user_op

    @dsl_user_op
    def now(*, loc: Any = None, ip: Any = None) -> Any:
        return Int64(llvm.inline_asm(T.i64(), [], "mov.u64 $0, %globaltimer;", "=l",
                                     has_side_effects=True, is_align_stack=False,
                                     asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))  # fmt: skip

    return now


@contextlib.contextmanager
def decode_kernels_as(wrap: Callable[[Any, dict[str, Any]], Any]) -> Iterator[None]:
    """Inside the block, every CuTe decode is compiled from ``wrap(kernel, spec)`` (e.g. the
    kernel with its class swapped for a stamped subclass), not from the shipped kernel; the
    compile cache is emptied on the way in and out, so neither build leaks into the other."""
    from tokenspeed.mla import cute_decode

    build = cute_decode.decode_kernel
    cute_decode.decode_kernel = lambda spec: wrap(build(spec), spec)
    cute_decode._COMPILED.clear()
    try:
        yield
    finally:
        cute_decode.decode_kernel = build
        cute_decode._COMPILED.clear()


def _timed_class(base: type) -> type:
    """``base`` with its consumer, epilogue and producer methods wrapped in stamps."""
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32, Int64

    from tokenspeed.kernels.cute_ops.common import ptx_i32

    assert _CLOCK is not None
    address, ctas = _CLOCK.data_ptr(), _CLOCK.shape[0]
    now = globaltimer_op()

    @cute.jit
    def stamp(when: Any, slot: cutlass.Constexpr, value: Any) -> None:
        if when:
            rb, split, b = cute.arch.block_idx()
            n_rb, n_split, _ = cute.arch.grid_dim()
            ptr = cute.make_ptr(Int64, address, cute.AddressSpace.gmem, assumed_align=8)
            clock = cute.make_tensor(ptr, cute.make_layout((ctas, SLOTS), stride=(SLOTS, 1)))
            clock[(b * n_split + split) * n_rb + rb, slot] = value

    def thread() -> Any:
        return cute.arch.thread_idx()[0]

    def sm_id() -> Any:
        return Int64(Int32(ptx_i32("mov.u32 $0, %smid;", "=r", [], side_effects=True)))

    class Timed(base):  # type: ignore[misc, valid-type]
        def _consume(self, *args: Any, **kwargs: Any) -> Any:
            stamp(thread() == 0, START, now())
            stamp(thread() == 0, SM, sm_id())
            return super()._consume(*args, **kwargs)

        def _epilogue(self, method: str, *args: Any, **kwargs: Any) -> Any:
            stamp(thread() == 0, EPI0_IN, now())
            stamp(thread() == 128, EPI1_IN, now())
            result = getattr(super(), method)(*args, **kwargs)
            stamp(thread() == 0, EPI0_OUT, now())
            stamp(thread() == 128, EPI1_OUT, now())
            return result

        def _write_rows(self, *args: Any, **kwargs: Any) -> Any:  # one row per element
            return self._epilogue("_write_rows", *args, **kwargs)

        def _finish_rows(self, *args: Any, **kwargs: Any) -> Any:  # two groups' halves
            return self._epilogue("_finish_rows", *args, **kwargs)

        def _produce(self, *args: Any, **kwargs: Any) -> Any:  # TMA producers
            result = super()._produce(*args, **kwargs)
            stamp(cute.arch.lane_idx() == 0, LAST_LOAD, now())
            return result

    Timed.__name__ = f"Timed{base.__name__}"
    return Timed


def _quantiles(xs: list[float], qs: tuple[float, ...]) -> dict[str, float]:
    """Nearest-rank quantiles (halves round up) of microseconds, to the nanosecond."""
    ordered = sorted(xs)
    return {f"{q:g}": round(ordered[int(q * (len(ordered) - 1) + 0.5)], 3) for q in qs}


def summarise(clock: torch.Tensor) -> dict[str, Any]:
    """Quantiles over the CTAs of one launch (``clock``: the CTAs' stamps, ns)."""
    stamped = clock[clock[:, START] > 0].double()
    t0 = stamped[:, START].min()
    two_groups = bool((stamped[:, EPI1_IN] > 0).all())
    epi_in = stamped[:, EPI0_IN]
    epi_out = stamped[:, EPI0_OUT]
    if two_groups:
        epi_in = torch.minimum(epi_in, stamped[:, EPI1_IN])
        epi_out = torch.maximum(epi_out, stamped[:, EPI1_OUT])

    def us(x: torch.Tensor) -> list[float]:
        return (x / 1e3).tolist()

    qs = (0.0, 0.5, 0.9, 1.0)
    row: dict[str, Any] = {
        "ctas": len(stamped),
        "sms": len(set(stamped[:, SM].long().tolist())),
        "span_us": round(float((epi_out.max() - t0) / 1e3), 3),
        "start_us": _quantiles(us(stamped[:, START] - t0), qs),
        "end_us": _quantiles(us(epi_out - t0), qs),
        "tiles_us": _quantiles(us(epi_in - stamped[:, START]), qs),
        "epilogue_us": _quantiles(us(epi_out - epi_in), qs),
        "last_load_to_epilogue_us": _quantiles(us(epi_in - stamped[:, LAST_LOAD]), qs),
    }
    return row


def timeline(heads: int, config: dict[str, Any] | None, fp8: str, reps: int) -> list[dict]:
    """``reps`` launches of the plan's kernel at one head count, each summarised."""
    global _CLOCK
    from sweep_decode import BATCH, KV_LEN, SCALE, _inputs

    from tokenspeed.mla import cute_decode

    if _CLOCK is None:
        _CLOCK = torch.zeros(8 * BATCH, SLOTS, dtype=torch.int64, device="cuda")

    def timed(kernel: Any, spec: dict[str, Any]) -> Any:
        kernel.__class__ = _timed_class(type(kernel))
        return kernel

    with decode_kernels_as(timed):
        x = _inputs(heads, 1, fp8=fp8)
        out = torch.empty(BATCH, 1, heads, 512, dtype=torch.bfloat16, device="cuda")

        def call() -> None:
            cute_decode.mla_decode(x["q"], x["cache"], x["tables"], x["seq"], SCALE, out=out,
                                   kv_scale=x["scale"], max_seq_len=KV_LEN, config=config)  # fmt: skip

        call()
        rows = []
        for _ in range(reps):
            _CLOCK.zero_()
            call()
            torch.cuda.synchronize()
            rows.append({"heads": heads, "config": config, "fp8": fp8, **summarise(_CLOCK.cpu())})
            print(json.dumps(rows[-1]))
        return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", default="32,64")
    parser.add_argument("--config", type=json.loads, default=None, help="plan keys, as JSON")
    parser.add_argument("--fp8", choices=("tensor", "token"), default="")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).parent))
    rows = []
    for heads in (int(h) for h in args.heads.split(",")):
        rows += timeline(heads, args.config, args.fp8, args.reps)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
