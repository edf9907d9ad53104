"""How many cycles one small wgmma takes on an SM, measured on the GPU.

The FP8 register decode (``mla/cute_decode_fp8_regs.py``) issues 68 ``HGMMA.64x16x16`` per
64-token tile at 16 rows (``64x32x16`` at 32), A from registers. This times back-to-back
wgmmas alone, for each N, A from registers (RS) or shared memory (SS), one accumulator chain
or two, and one to four warp groups per SM, and reports nanoseconds and cycles per wgmma per
SM (the clock is the one ``fp8_widen_rate.py`` reads, ``%clock64`` against ``%globaltimer``,
in a logic-only kernel run just before; under the tensor load it may be lower):

    python3 benchmarks/mla/wgmma_rate.py [--out FILE.json] [--n 16,32,64,256] [--chains 1,2]
    python3 benchmarks/mla/wgmma_rate.py --feed --n 16,32 --groups 2,3,4 --buffers 2,3,4

Each warp group keeps up to two commit groups of ``K_BLOCKS`` wgmmas in flight (the decode's
pattern: ``wait_group(1)`` after each commit), its operands never rewritten, so the rate is
the issue and tensor pipe's, not a dependency on loads. ``--feed`` instead rebuilds the A
operand before every commit group as the decode's scores do: two 16-byte shared loads of
e4m3 bytes, 16 ``cvt`` to f16 pairs into one of ``--buffers`` operand buffers (the others'
wgmmas still in flight), then the four wgmmas. The ideal, from Hopper's dense f16 rate (989
TFLOP/s over 132 SMs at 1.83 GHz: 4096 FLOP per clock per SM), is ``64 * N * 16 * 2 / 4096``
cycles: 8 at N = 16, 16 at N = 32.

What it found on the H200 (``benchmarks/results/h200_wgmma_rate*.json``, docs/mla-experiments.md):
RS at N = 16 takes 7.7 ns (15 cycles at 1.98 GHz) a wgmma with three groups, half the dense rate;
N = 32, 9.3 ns (18.5 cycles); N = 64 and 256 run within 15 % of the ideal. Fed, N = 16
takes 24.8 / 14.7 / 12.9 ns with one / two / three groups, and four groups or deeper
buffers gain at most 2 % more: feeding costs at least ~1.7x the tensor core's own time
there, whatever the warp count.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import torch

K_BLOCKS = 4  # wgmmas a commit group (the decode's scores commit four k-blocks at a time)


def _rate_kernel(
    n: int,
    a_in_regs: bool,
    groups: int,
    chains: int,
    sms: int,
    feed: bool = False,
    buffers: int = 2,
) -> Any:
    """The CuTe kernel object for one configuration (imports CuTe DSL lazily)."""
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    import cutlass.utils as utils
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass import Float16, Float32, Int32, Uint8, Uint32
    from cutlass.cute.nvgpu import warpgroup

    from tokenspeed.kernels.cute_ops.common import vector_at
    from tokenspeed.mla.fp8_widen import e4m3x2_to_f16x2

    if feed and not a_in_regs:
        raise ValueError("--feed builds the A operand in registers")
    feed_bytes = 8192  # the e4m3 bytes the fed loads cycle through

    class WgmmaRate:
        """``groups`` warp groups, each issuing ``iters`` commit groups of ``K_BLOCKS``
        wgmmas of 64 x ``n`` x 16 into ``chains`` accumulators in turn."""

        def __init__(self) -> None:
            self.threads = 128 * groups

        @cute.jit
        def __call__(self, m_out: cute.Tensor, iters: Int32, stream: cuda.CUstream):
            k_major = warpgroup.OperandMajorMode.K
            source = warpgroup.OperandSource.RMEM if a_in_regs else warpgroup.OperandSource.SMEM
            mma = sm90_utils.make_trivial_tiled_mma(
                Float16, Float16, k_major, k_major, Float32, (1, 1, 1), tiler_mn=(64, n),
                a_source=source,
            )  # fmt: skip
            row_major = utils.LayoutEnum.ROW_MAJOR
            tile = (64, n, 16 * K_BLOCKS)
            a_layout = sm90_utils.make_smem_layout_a(row_major, tile, Float16, 1)
            b_layout = sm90_utils.make_smem_layout_b(row_major, tile, Float16, 1)

            fp8_bytes = cute.make_layout(feed_bytes)  # the struct's body sees __call__'s names

            @cute.struct
            class SharedStorage:
                s_a: cute.struct.Align[cute.struct.MemRange[Float16, cute.cosize(a_layout)], 1024]
                s_b: cute.struct.Align[cute.struct.MemRange[Float16, cute.cosize(b_layout)], 1024]
                s_fp8: cute.struct.Align[cute.struct.MemRange[Float16, cute.cosize(fp8_bytes) // 2],
                                         128]  # fmt: skip

            self.shared_storage = SharedStorage
            self.kernel(mma, a_layout, b_layout, m_out, iters).launch(
                grid=[sms, 1, 1],
                block=[self.threads, 1, 1], stream=stream,
            )  # fmt: skip

        @cute.kernel
        def kernel(self, mma: cute.TiledMma, a_layout: cute.ComposedLayout,
                   b_layout: cute.ComposedLayout, m_out: cute.Tensor, iters: Int32):  # fmt: skip
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            smem = utils.SmemAllocator()
            storage = smem.allocate(self.shared_storage)
            s_a = storage.s_a.get_tensor(a_layout.outer, swizzle=a_layout.inner)
            s_b = storage.s_b.get_tensor(b_layout.outer, swizzle=b_layout.inner)
            # small finite operands (the values do not change the rate; NaNs would be noise)
            flat_a = storage.s_a.get_tensor(cute.make_layout(cute.cosize(a_layout)))
            flat_b = storage.s_b.get_tensor(cute.make_layout(cute.cosize(b_layout)))
            for i in cutlass.range(tidx, cute.cosize(a_layout), self.threads, unroll=1):
                flat_a[i] = Float16(0.0)
            for i in cutlass.range(tidx, cute.cosize(b_layout), self.threads, unroll=1):
                flat_b[i] = Float16(0.0)
            s_fp8 = cute.make_tensor(cute.recast_ptr(storage.s_fp8.data_ptr(), dtype=Uint8),
                                     cute.make_layout((feed_bytes,)))  # fmt: skip
            for i in cutlass.range(tidx, feed_bytes, self.threads, unroll=1):
                s_fp8[i] = Uint8(0x38)  # e4m3 1.0
            cute.arch.fence_proxy(
                cute.arch.ProxyKind.async_shared, space=cute.arch.SharedSpace.shared_cta
            )
            cute.arch.sync_threads()

            thr = mma.get_slice(tidx % 128)
            r_b = mma.make_fragment_B(thr.partition_B(s_b[None, None, 0]))
            accs = [
                cute.make_rmem_tensor(mma.partition_shape_C((64, n)), Float32)
                for _ in range(chains)
            ]
            for acc in accs:
                acc.fill(0.0)
            if cutlass.const_expr(a_in_regs):
                r_a = cute.make_rmem_tensor(mma.partition_shape_A((64, 16 * K_BLOCKS)), Float16)
                # loaded, not filled with a constant: ptxas would rebuild a constant operand
                # inside the loop
                for i in cutlass.range_constexpr(cute.size(r_a)):
                    r_a[i] = flat_a[(tidx * cute.size(r_a) + i) % cute.cosize(a_layout)]
            else:
                r_a = mma.make_fragment_A(thr.partition_A(s_a[None, None, 0]))
            mma.set(warpgroup.Field.ACCUMULATE, True)
            if cutlass.const_expr(not feed):
                for _ in cutlass.range(iters, unroll=1):
                    warpgroup.fence()
                    for k in cutlass.range_constexpr(K_BLOCKS):
                        acc = accs[k % chains]
                        cute.gemm(mma, acc, r_a[None, None, k], r_b[None, None, k], acc)
                    warpgroup.commit_group()
                    warpgroup.wait_group(1)
            else:
                a_bufs = [r_a] + [cute.make_rmem_tensor_like(r_a) for _ in range(buffers - 1)]
                a_words = [cute.recast_tensor(a, Uint32) for a in a_bufs]
                runs = [cute.make_rmem_tensor((16,), Uint8) for _ in range(2)]
                run_words = [cute.recast_tensor(r, Uint32) for r in runs]
                for it in cutlass.range(iters // buffers, unroll=1):
                    for half in cutlass.range_constexpr(buffers):
                        # two 16-byte runs a thread, a different pair every commit group
                        at = ((buffers * it + half) * 4096 + (tidx % 128) * 32) % feed_bytes
                        for r in cutlass.range_constexpr(2):
                            cute.autovec_copy(vector_at(s_fp8, (at + 16 * r,), 16), runs[r])
                        # the wgmmas reading this buffer are done
                        warpgroup.wait_group(buffers - 1)
                        words = a_words[half]
                        for u in cutlass.range_constexpr(16):  # every word of the operand
                            words[u] = e4m3x2_to_f16x2(run_words[u // 8][(u % 8) // 2],
                                                       u % 2 == 1)  # fmt: skip
                        warpgroup.fence()
                        for k in cutlass.range_constexpr(K_BLOCKS):
                            acc = accs[k % chains]
                            cute.gemm(mma, acc, a_bufs[half][None, None, k], r_b[None, None, k],
                                      acc)  # fmt: skip
                        warpgroup.commit_group()
            warpgroup.wait_group(0)
            total = Float32(0.0)
            for acc in accs:
                for i in cutlass.range_constexpr(cute.size(acc)):
                    total = total + acc[i]
            m_out[bidx * self.threads + tidx] = total  # keeps the products live

    return WgmmaRate()


def _sm_clock_ghz() -> float:
    """The SM clock under an ALU load (``fp8_widen_rate.py``'s logic-only chains)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fp8_widen_rate import LOGIC
    from fp8_widen_rate import measure as widen_measure

    return widen_measure(LOGIC)["sm_ghz"]


def measure(
    n: int,
    a_in_regs: bool,
    groups: int,
    chains: int,
    feed: bool = False,
    buffers: int = 2,
    iters: int = 4096,
) -> dict:
    """Cycles per wgmma per SM for one configuration, timed with CUDA events."""
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute
    from cutlass import Int32

    from tokenspeed.kernels.cute_ops.common import cute_tensor

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.zeros(sms * 128 * groups, dtype=torch.float32, device="cuda")
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    m_out = cute_tensor(out)
    iters -= iters % buffers  # whole rounds of the operand buffers
    kernel = _rate_kernel(n, a_in_regs, groups, chains, sms, feed, buffers)
    fn = cute.compile(kernel, m_out, Int32(iters), stream)
    fn(m_out, Int32(iters), stream)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn(m_out, Int32(iters), stream)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / 5
    return {"n": n, "a": "registers" if a_in_regs else "shared", "groups": groups,
            "chains": chains, "feed": feed, "buffers": buffers if feed else None,
            "seconds": seconds,
            "wgmma_per_sm": groups * iters * K_BLOCKS}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Time every configuration; JSON to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--n", default="16,32,64,256")
    parser.add_argument("--groups", default="1,2,3")
    parser.add_argument("--chains", default="1", help="accumulators a warp group cycles through")
    parser.add_argument("--buffers", default="2", help="--feed: register operands in flight")
    parser.add_argument(
        "--feed", action="store_true", help="rebuild A from e4m3 bytes before each commit group"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    ghz = _sm_clock_ghz()
    rows = []
    for n in (int(x) for x in args.n.split(",")):
        for a_in_regs in (True,) if args.feed else (True, False):
            for groups in (int(x) for x in args.groups.split(",")):
                for chains, buffers in itertools.product(
                    (int(x) for x in args.chains.split(",")),
                    (int(x) for x in args.buffers.split(",")) if args.feed else (2,),
                ):
                    # what one thread's accumulators and operands take must leave room
                    regs = chains * n // 2 + (48 + 16 * buffers if args.feed else 48)
                    if regs > 200 or 128 * groups * regs > 65536:
                        continue
                    r = measure(n, a_in_regs, groups, chains, args.feed, buffers)
                    cycles = r["seconds"] * ghz * 1e9 / r["wgmma_per_sm"]
                    r.update(sm_ghz=ghz, ns_per_wgmma=r["seconds"] * 1e9 / r["wgmma_per_sm"],
                             cycles_per_wgmma=cycles, ideal_cycles=64 * n * 16 * 2 / 4096)  # fmt: skip
                    rows.append(r)
                    print(json.dumps(r), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
