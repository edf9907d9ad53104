"""The e4m3 arithmetic the FP8-cache decode kernels share (CuTe DSL, SM90).

wgmma multiplies 16-bit types, and an FP8 cache's values are multiplied in f16: e4m3 widens
to f16 exactly in one hardware conversion per pair (there is none to bf16), and the bf16
query is brought into f16's range by ``Q_F16_SCALE``. f16 products are also 6-9x more
accurate than bf16 ones here (``P`` keeps 10 mantissa bits; docs/mla-experiments.md). The scale of
the cache (one per tensor or one per token) is applied by the kernels in float32; per-token
scales travel beside each tile by ``copy_page_scales``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Uint32
from cutlass.cute.nvgpu import cpasync
from cutlass.cutlass_dsl import dsl_user_op

from tokenspeed.kernels.cute_ops.common import ptx_i32

# f16 products: the query is brought into f16's range scaled by 2^-4 (up to about
# 1e6 in magnitude, and below 1e-3 still finer than its own bf16 rounding); the scores undo it
Q_F16_SCALE = 2.0**-4

# e4m3 -> f16 is one hardware conversion per pair (there is none to bf16): two of a word's
# four bytes, the low (or high) 16 bits, to an f16x2 of the same values, exactly.
_E4M3X2_TO_F16X2 = """{
    .reg .b16 lo, hi;
    mov.b32 {lo, hi}, $1;
    cvt.rn.f16x2.e4m3x2 $0, HALF;
}"""


@dsl_user_op
def e4m3x2_to_f16x2(word: Uint32, high: bool, *, loc=None, ip=None) -> Uint32:
    """Bytes 0-1 (or 2-3 when ``high``) of ``word`` as an f16x2 of the same e4m3 values."""
    word = Uint32(word).ir_value(loc=loc, ip=ip)
    ptx = _E4M3X2_TO_F16X2.replace("HALF", "hi" if high else "lo")
    return Uint32(ptx_i32(ptx, "=r,r", [word], side_effects=False, loc=loc, ip=ip))


# The query's bf16 pair to f16 times Q_F16_SCALE (2^-4, 0f3D800000), multiplied in f32: written
# as ``(x.to(Float32) * Q_F16_SCALE).to(Float16)`` the compiler narrowed the multiply to an f16
# HMUL2 after the conversion, so a query value past 65504 became inf (caught on the H200).
_BF16X2_TO_F16X2_SCALED = """{
    .reg .b32 lo, hi;
    shl.b32 lo, $1, 16;
    and.b32 hi, $1, 0xFFFF0000;
    mul.rn.f32 lo, lo, 0f3D800000;
    mul.rn.f32 hi, hi, 0f3D800000;
    cvt.rn.f16x2.f32 $0, hi, lo;
}"""
assert Q_F16_SCALE == 2.0**-4  # the constant above


@dsl_user_op
def bf16x2_to_f16x2_scaled(word: Uint32, *, loc=None, ip=None) -> Uint32:
    """A bf16x2 as the f16x2 of its values times ``Q_F16_SCALE``, rounded once."""
    word = Uint32(word).ir_value(loc=loc, ip=ip)
    ptx = _BF16X2_TO_F16X2_SCALED
    return Uint32(ptx_i32(ptx, "=r,r", [word], side_effects=False, loc=loc, ip=ip))


@cute.jit
def copy_page_scales(
    scale_atom, m_scale, slot_scale, page_block: cutlass.Constexpr, box, c, index, barrier
):  # fmt: skip
    """Page block ``box``'s per-token scales (contiguous, like its tokens) into block ``c`` of
    slot ``index``'s scales (``slot_scale``: token, slot), by one bulk copy completing on
    ``barrier``: what every FP8 loader sends beside a tile's bytes."""
    g_scale = cute.make_tensor(
        cute.make_ptr(Float32, m_scale.iterator.toint() + cutlass.Int64(box) * page_block * 4,
                      cute.AddressSpace.gmem, assumed_align=16),
        cute.make_layout(page_block),
    )  # fmt: skip
    s_scale = cute.local_tile(slot_scale[None, index], (page_block,), (c,))
    src, dst = cpasync.group_bulk_copy_modes(g_scale, s_scale)
    with cute.arch.elect_one():
        cute.copy(scale_atom, src, dst, mbar_ptr=barrier)
