"""What the CuTe DSL kernels share: the wgmma accumulator's column order and the reductions
down its rows (the token axis of a tokens-on-M product), the online softmax's running max
across a warp group, the L2 hint, inline PTX with one 32-bit result, vector accesses the DSL
cannot prove aligned, output rows staged in shared memory and stored whole, and the
torch-to-CuTe tensor view."""

from __future__ import annotations

import math
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

# The 64-bit L2 cache-policy operand of an evict-first load (the encoding CUTLASS's
# TMA::CacheHintSm90::EVICT_FIRST uses): streamed tiles that are read once.
L2_EVICT_FIRST = 0x12F0000000000000


def accumulator_slot(i: int, cols: int) -> int:
    """Which of a thread's ``cols / 4`` accumulator columns fragment element ``i`` is in.

    A ``wgmma`` m64nN accumulator holds, per thread, values ordered (column pair, row half,
    8-column block[, M tile]): element ``i`` sits in column ``2 * (lane % 4) + i % 2 +
    8 * ((i % (cols / 2)) // 4)``; this returns that column's index among the thread's own.
    """
    within = i % (cols // 2)
    return (within % 2) + 2 * (within // 4)


def accumulator_column(j: int, quad_lane: Any) -> Any:
    """The column a thread's ``j``-th own accumulator column is (``accumulator_slot``'s
    inverse); ``quad_lane`` is ``lane % 4``."""
    return 2 * quad_lane + (j % 2) + 8 * (j // 2)


def column_max(x: Any) -> Any:
    """The maximum of ``x`` over the 8 lanes of a warp that hold the same accumulator
    columns (lanes equal mod 4): a warp's 16 rows of those columns, with each thread's own two
    rows already folded into ``x``."""
    x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=4))
    x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=8))
    return cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=16))


def column_sum(x: Any) -> Any:
    """The sum of ``x`` over the same 8 lanes as ``column_max``."""
    x = x + cute.arch.shuffle_sync_bfly(x, offset=4)
    x = x + cute.arch.shuffle_sync_bfly(x, offset=8)
    return x + cute.arch.shuffle_sync_bfly(x, offset=16)


@cute.jit
def merge_row_max(
    tile_max: Any,
    m_i: Any,
    l_i: Any,
    red: Any,
    red_tail: tuple,
    warp: Any,
    lane: Any,
    barrier_id: Any,
) -> tuple[Any, Any]:
    """A tokens-on-M tile's step of the online softmax across a warp group's four warps,
    which each hold 16 of the tile's tokens: each thread's row maxima of the tile
    (``tile_max``) reduced over its warp, exchanged through ``red[(row, warp, *red_tail)]``
    and named barrier ``barrier_id`` (128 threads); the running max ``m_i`` moves to the
    larger and the denominators ``l_i`` are rescaled. Returns ``(alpha, m_use)``: the
    factor the output is rescaled by, and the max to subtract from the scores (0 for a row
    with nothing seen yet, so that a fully masked tile yields zeros, not NaNs)."""
    slots = cute.size(tile_max)
    for j in cutlass.range_constexpr(slots):
        tile_max[j] = column_max(tile_max[j])
    if lane < 4:
        for j in cutlass.range_constexpr(slots):
            red[(accumulator_column(j, lane), warp, *red_tail)] = tile_max[j]
    cute.arch.barrier(barrier_id=barrier_id, number_of_threads=128)
    alpha = cute.make_rmem_tensor((slots,), cutlass.Float32)
    m_use = cute.make_rmem_tensor((slots,), cutlass.Float32)
    for j in cutlass.range_constexpr(slots):
        n = accumulator_column(j, lane % 4)
        x = m_i[j]
        for w in cutlass.range_constexpr(4):
            x = cute.arch.fmax(x, red[(n, w, *red_tail)])
        mu = x
        if x == -math.inf:
            mu = cutlass.Float32(0.0)
        alpha[j] = cutlass.Float32(cute.math.exp2(m_i[j] - mu, fastmath=True))
        m_use[j] = mu
        m_i[j] = x
        l_i[j] = l_i[j] * alpha[j]
    return alpha, m_use


@dsl_user_op
def barrier_or(pred: Any, barrier_id: Any, threads: int, *, loc=None, ip=None) -> Any:
    """``bar.red.or.pred``: named barrier ``barrier_id`` for ``threads`` threads that also
    tells each of them whether any passed a non-zero ``pred`` (1 or 0, the same in all), in
    one instruction where an exchange through shared memory takes stores, a barrier and
    loads."""
    ptx = (
        "{ .reg .pred q, p; setp.ne.s32 q, $1, 0; "
        f"bar.red.or.pred p, $2, {threads}, q; selp.s32 $0, 1, 0, p; }}"
    )
    operands = [cutlass.Int32(pred).ir_value(loc=loc, ip=ip),
                cutlass.Int32(barrier_id).ir_value(loc=loc, ip=ip)]  # fmt: skip
    return cutlass.Int32(ptx_i32(ptx, "=r,r,r", operands, side_effects=True, loc=loc, ip=ip))


def ptx_i32(
    ptx: str, constraints: str, operands: list[Any], *, side_effects: bool, loc=None, ip=None
) -> Any:
    """The 32-bit result (an IR value) of inline PTX, for the few instructions the DSL does not
    wrap; ``side_effects`` keeps a memory access from being moved or dropped."""
    return llvm.inline_asm(
        T.i32(),
        operands,
        ptx,
        constraints,
        has_side_effects=side_effects,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )


def vector_at(t: Any, coord: Any, n: int) -> Any:
    """``n`` elements of ``t`` from ``coord`` along its unit-stride last mode, as a tensor whose
    offset is asserted to be a multiple of ``n``, so that one vector access covers them.

    The caller guarantees it (for instance, a wgmma accumulator's element pairs are adjacent
    columns from an even one, and padded rows keep 16-byte chunks aligned). The DSL cannot
    prove that of a run-time index and would split the access into single elements.
    """
    offset = cute.assume(cute.crd2idx(coord, t.layout), divby=n)
    return cute.make_tensor(t.iterator + offset, cute.make_layout((n,), stride=(1,)))


# Rows an epilogue stages in shared memory are padded by 16 bytes: the 8 rows one store of a
# wgmma accumulator fragment spans then fall in distinct banks (a 1 KiB row stride would put
# them all in the same four).
STAGE_ROW_PAD = 8


def staged_rows(ptr: Any, rows: int, dims: int) -> Any:
    """A ``[rows, dims]`` view of shared memory from ``ptr`` (16-byte aligned), for an epilogue
    to gather its output rows in before ``store_staged_rows`` writes them out whole."""
    return cute.make_tensor(ptr, cute.make_layout((rows, dims), stride=(dims + STAGE_ROW_PAD, 1)))


@cute.jit
def store_staged_rows(
    s_rows: cute.Tensor, m_out: cute.Tensor, first_row: Any, valid_rows: Any, tid: Any,
    threads: cutlass.Constexpr,
):  # fmt: skip
    """Copy staged rows ``0 .. valid_rows - 1`` to ``m_out``'s rows from ``first_row``, by the
    ``threads`` threads numbered ``tid``: 16 bytes per access, and each warp's access one
    contiguous run of 512 bytes.

    Stored straight from accumulator fragments, every warp store wrote 16 bytes in each of 8
    rows: under the other SMs' read traffic, the 64-row kernel's 64 rows took the H200 5.5 us
    at the end of every CTA (0.8 us of it not the stores); staged and stored this way, 2.0 us
    (docs/mla-experiments.md)."""
    rows = cute.size(s_rows, mode=[0])
    vec = 128 // m_out.element_type.width
    per_row = cute.size(s_rows, mode=[1]) // vec
    assert (rows * per_row) % threads == 0, "staged rows must split evenly over the threads"
    chunk = cute.make_rmem_tensor((vec,), m_out.element_type)
    for k in cutlass.range_constexpr(rows * per_row // threads):
        index = k * threads + tid
        row = index // per_row
        col = (index % per_row) * vec
        cute.autovec_copy(vector_at(s_rows, (row, col), vec), chunk)
        if row < valid_rows:
            cute.autovec_copy(chunk, vector_at(m_out, (first_row + row, col), vec))


def cute_tensor(t: Any, align: int = 16, *, all_dynamic: bool = False) -> Any:
    """A CuTe view of a torch tensor whose leading extent is a run-time value.

    Row-major 2-D tensors keep their (fixed) last extent static, so its stride is known to
    the compiler; ``all_dynamic`` makes every extent and stride a run-time value (the block
    table's width changes between calls and must not be baked into the compiled kernel).
    """
    from cutlass.cute.runtime import from_dlpack

    ct = from_dlpack(t, assumed_align=align)
    if t.dim() == 1 or all_dynamic:
        return ct.mark_layout_dynamic(leading_dim=t.dim() - 1)
    return ct.mark_compact_shape_dynamic(mode=0, stride_order=tuple(range(t.dim())))
