"""What the CuTe DSL kernels share: the wgmma accumulator's column order and the reductions
down its rows (the token axis of a tokens-on-M product), the L2 hint, inline PTX with one
32-bit result, and the torch-to-CuTe tensor view."""

from __future__ import annotations

from typing import Any

import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T

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
