"""Absorbed-MLA decode over an FP8 (e4m3) latent cache for Hopper (SM90), in CuTe DSL.

The bf16 kernel of ``cute_decode.py`` (KV tokens on the MMA M axis, 16 or 32 query rows per
CTA) with one more stage in front of it. wgmma multiplies 16-bit types (FP8 by FP8 would need
an FP8 query and P), so the FP8 tile has to be widened in shared memory before either product
can read it; doing that in the warp group that runs the products would put the conversion on
its critical path, so a third role does it:

* a loader warp copies each 64-token FP8 tile (36 KiB: half a widened tile) with bulk
  copies, one per page block (a page's tokens are contiguous rows of 576 bytes), into a ring
  of ``fp8_stages`` slots;
* one or two converter warp groups read a slot into registers, release it (so the next
  load starts), and widen it exactly into a 16-bit tile of the MMA ring: the raw e4m3 values,
  which f16 and bf16 both hold without rounding, plus each token's scale beside the tile
  when scales are per token. To f16 by default (``mma_f16``: one hardware conversion per pair
  of values, ``e4m3x2_to_f16x2``; 8-10 % faster on the H200), or to bf16 (``widen_e4m3x2``:
  a byte permute, three integer ops and a multiply per pair);
* the consumer warp group is ``MlaDecodeSm90``'s: scores, online softmax and the product
  with V over the widened tile, with the scale applied there in float32 (folded into the
  softmax scale and the output, or per token into the scores and P). With f16 products it
  first converts the query block to f16 in place (``query_to_f16``, scaled by
  ``Q_F16_SCALE`` to keep large queries in range; the scores undo it).

Shared memory (32 rows): query 36 KiB + ``stages`` 16-bit tiles of 72 KiB + P 4 KiB +
``fp8_stages`` FP8 slots of 36 KiB: two 16-bit tiles and one FP8 slot, or one and three (two
and one with two converter groups measured fastest, docs/mla.md). Without the products the
loads, widening and hand-over alone take 106-109 us at 16 and 32 heads (about two thirds of
the copy bandwidth); the products add 13-30 %. Since the twenty-eighth session the plan takes
``cute_decode_fp8_regs.py`` for 16-32 rows instead (widened in the consumers' registers, no
16-bit copy: 1.27x / 1.11x faster at 16 / 32 heads); this kernel stays on request (plan
layout ``"tokens"``).

Needs ``nvidia-cutlass-dsl`` (4.3) and an SM90 GPU; bf16 query, e4m3 cache with a float32
scale per tensor (one element) or per token. The launch wrapper is ``cute_decode.mla_decode``.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
from cutlass import BFloat16, Float16, Float32, Int32, Uint8, Uint32
from cutlass.cute.nvgpu import cpasync
from cutlass.cutlass_dsl import dsl_user_op

from tokenspeed.kernels.cute_ops.common import ptx_i32

from .cute_decode import D_QK, TILE, MlaDecodeSm90

_CHUNK = 16  # FP8 values a converter thread moves at a time (one 16-byte shared load)

# e4m3 (bias 7) and bf16 (bias 127) differ in exponent width only: an e4m3 byte's sign kept
# and its other seven bits moved down by four is a bf16 of the same value times 2^-120,
# subnormals included. One exact bf16x2 multiply by 2^120 (0x7B80) undoes that: per pair a
# byte permute, three integer ops and the multiply, where the cvt route (e4m3x2 -> f16x2 ->
# 2 x f32, times the scale, -> bf16x2) takes six instructions, four of them conversions, and
# rounds each value times its scale to bf16. (e4m3's NaN bytes come out as +-480, finite; a
# quantiser saturates and never writes them.)
_WIDEN_E4M3X2 = """{
    .reg .b32 t, m;
    prmt.b32 t, $1, 0, SELECTOR;
    and.b32 m, t, 0x7F007F00;
    shr.b32 m, m, 4;
    and.b32 t, t, 0x80008000;
    or.b32 t, t, m;
    mov.b32 m, 0x7B807B80;
    mul.rn.bf16x2 $0, t, m;
}"""


@dsl_user_op
def widen_e4m3x2(word: Uint32, high: bool, *, loc=None, ip=None) -> Uint32:
    """Two of ``word``'s four e4m3 bytes (0-1, or 2-3 when ``high``) as a bf16x2 of the same
    values, exactly: the consumer applies the scale in float32."""
    selector = "0x3424" if high else "0x1404"  # bytes into the top of each half, zeros below
    word = Uint32(word).ir_value(loc=loc, ip=ip)
    ptx = _WIDEN_E4M3X2.replace("SELECTOR", selector)
    return Uint32(ptx_i32(ptx, "=r,r", [word], side_effects=False, loc=loc, ip=ip))


# f16 products (``mma_f16``): the query is brought into f16's range scaled by 2^-4 (up to about
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


@cute.jit
def widen_word(
    out: cute.Tensor, w: cutlass.Constexpr, word: Uint32, live, to_f16: cutlass.Constexpr
):
    """A word's four e4m3 values, exactly, as 16-bit pairs ``out[2w]`` and ``out[2w + 1]``:
    f16 by hardware conversion (zeros for a token past the split's end, ``live`` false: a NaN
    byte would reach the products as NaN), or bf16 by ``widen_e4m3x2`` (every byte finite)."""
    if cutlass.const_expr(to_f16):
        word = Uint32(cutlass.select_(live, word, Uint32(0)))
        out[2 * w] = e4m3x2_to_f16x2(word, False)
        out[2 * w + 1] = e4m3x2_to_f16x2(word, True)
    else:
        out[2 * w] = widen_e4m3x2(word, False)
        out[2 * w + 1] = widen_e4m3x2(word, True)


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
def query_to_f16(flat: cute.Tensor, tidx: Int32, threads: cutlass.Constexpr):
    """The query block in shared memory (bf16 bits, as its copy brought it; ``flat``: a 1-D
    view, as an element's position does not matter) becomes f16 times ``Q_F16_SCALE`` in
    place, eight values a thread at a time over ``threads`` threads, fenced for the async
    proxy; the caller syncs those threads before any product reads it."""
    per = 8
    n = cute.size(flat)
    bits = cute.recast_tensor(flat, BFloat16)
    q_bf = cute.make_rmem_tensor((per,), BFloat16)
    q_f16 = cute.make_rmem_tensor((per,), Float16)
    bf_words = cute.recast_tensor(q_bf, Uint32)
    f16_words = cute.recast_tensor(q_f16, Uint32)
    for k in cutlass.range_constexpr(n // (per * threads)):
        chunk = k * threads + tidx
        cute.autovec_copy(cute.local_tile(bits, (per,), (chunk,)), q_bf)
        for e in cutlass.range_constexpr(per // 2):
            f16_words[e] = bf16x2_to_f16x2_scaled(bf_words[e])
        cute.autovec_copy(q_f16, cute.local_tile(flat, (per,), (chunk,)))
    cute.arch.fence_proxy(cute.arch.ProxyKind.async_shared, space=cute.arch.SharedSpace.shared_cta)


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


class Fp8TileLoader:
    """What the FP8 decode kernels share: the loader warp's bulk copies of 64-token e4m3
    tiles (a page's tokens are contiguous rows of 576 bytes, so one copy per page block, no
    tensor map) into a ring of ``fp8_stages`` slots, and the per-token scale lookup. A
    kernel sets ``page_block``, ``copies_per_tile``, ``fp8_stages`` and ``ablation``."""

    @cute.jit
    def _load_tiles(
        self, bulk_atom, m_kv, s_fp8, fp8_pipe, m_bt, b, start, end, n_tiles, page_size,
        scale_atom=None, m_scale=None, slot_scale=None,
    ):  # fmt: skip
        """The loader warp's tiles: every FP8 tile of the split, by bulk copies into the ring,
        and with ``slot_scale`` (token, slot) each page block's per-token scales beside it
        (contiguous too; the ring's byte count must include them).

        A box past the split's end copies the split's first box instead (its bytes are read
        but never used: the consumers zero those tokens), so every slot receives the same
        byte count.
        """
        box_bytes = self.page_block * D_QK
        base = m_kv.iterator.toint()
        s_boxes = cute.make_tensor(  # (box bytes, copy, stage): each box is contiguous
            s_fp8.iterator,
            cute.make_layout((box_bytes, self.copies_per_tile, self.fp8_stages),
                             stride=(1, box_bytes, TILE * D_QK)),
        )  # fmt: skip
        first = Int32(0)
        if n_tiles > 0:  # a split with no tiles may start past the block table
            first = (m_bt[b, start // page_size] * page_size + start % page_size) // self.page_block
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                             self.fp8_stages)  # fmt: skip
        for tile in cutlass.range(n_tiles, unroll=1):
            fp8_pipe.producer_acquire(state)
            for c in cutlass.range_constexpr(self.copies_per_tile):
                pos = start + tile * TILE + c * self.page_block
                box = first
                if pos < end:
                    page = m_bt[b, pos // page_size]
                    box = (page * page_size + pos % page_size) // self.page_block
                if cutlass.const_expr(self.ablation == "l2_loads"):
                    box = Int32(c)  # benchmark-only: every tile from L2 (see MlaDecodeSm90)
                # the box as global memory (bulk copies need it), its offset in 64 bits
                g_box = cute.make_tensor(
                    cute.make_ptr(Uint8, base + cutlass.Int64(box) * box_bytes,
                                  cute.AddressSpace.gmem, assumed_align=16),
                    cute.make_layout(box_bytes),
                )  # fmt: skip
                src, dst = cpasync.group_bulk_copy_modes(g_box, s_boxes[None, c, state.index])
                with cute.arch.elect_one():  # one bulk copy, not one per lane
                    cute.copy(bulk_atom, src, dst,
                              mbar_ptr=fp8_pipe.producer_get_barrier(state))  # fmt: skip
                if cutlass.const_expr(slot_scale is not None):
                    copy_page_scales(scale_atom, m_scale, slot_scale, self.page_block, box, c,
                                     state.index, fp8_pipe.producer_get_barrier(state))  # fmt: skip
            state.advance()

    @cute.jit
    def _token_scale(self, m_scale, m_bt, b, pos, end, page_size):
        """The scale of the token at ``pos`` (0 past the split's end)."""
        tok_scale = Float32(0.0)
        if pos < end:
            page = m_bt[b, pos // page_size]
            tok_scale = m_scale[page * page_size + pos % page_size]
        return tok_scale


class MlaDecodeFp8Sm90(Fp8TileLoader, MlaDecodeSm90):
    """One compiled FP8 variant: rows (16/32), page copy size, ring depths, scale kind."""

    def __init__(
        self, rows: int, page_block: int, stages: int, fp8_stages: int, split: bool,
        write_lse: bool, per_token: bool, converter_wgs: int = 1, ablation: str = "",
        mma_f16: bool = False,
    ) -> None:  # fmt: skip
        if rows not in (16, 32):
            raise ValueError(f"rows={rows}: the FP8 decode takes 16 or 32 rows per CTA")
        super().__init__(rows, 1, page_block, stages, split, write_lse, ablation)
        self.fp8_stages = fp8_stages
        self.per_token = per_token
        if converter_wgs not in (1, 2):
            raise ValueError(f"converter_wgs={converter_wgs}: 1 or 2 warp groups convert")
        # Warps 0-3 consume, then 4 or 8 warps convert, then one warp loads (in a warp group
        # of its own, so that setmaxnreg can move registers: ptxas caps a 288-thread CTA at
        # 168 per thread).
        self.converter_wgs = converter_wgs
        self.converter_warp = 4
        self.producer_warp = 4 + 4 * converter_wgs
        self.threads = (2 + converter_wgs) * 128
        # f16 products: the converters widen by one hardware conversion per pair of values
        # (tokens past the split's end as zeros: a NaN byte would reach the products as NaN);
        # the consumer converts the query block once (``query_to_f16``)
        self.mma_dtype = Float16 if mma_f16 else BFloat16

    # -- host side ----------------------------------------------------------------------------

    @cute.jit
    def __call__(
        self,
        m_q: cute.Tensor,  # [rows_total, 576] bf16
        m_kv: cute.Tensor,  # [pages * page_size * 576] uint8 (the e4m3 bytes)
        m_scale: cute.Tensor,  # [1] or [pages * page_size] fp32
        m_bt: cute.Tensor,
        m_seq: cute.Tensor,
        m_out: cute.Tensor,
        m_lse: cute.Tensor,
        m_part_o: cute.Tensor,
        m_part_lse: cute.Tensor,
        scale_log2: Float32,
        q_len: Int32,
        num_heads: Int32,
        num_splits: Int32,
        page_size: Int32,
        batch: Int32,
        row_blocks: Int32,
        stream: cuda.CUstream,
    ):
        mma_s, mma_o, kv_layout, vt_layout, q_layout, p_layout = self._mmas_and_layouts()
        fp8_layout = cute.make_layout((TILE, D_QK, self.fp8_stages),
                                      stride=(D_QK, 1, TILE * D_QK))  # fmt: skip
        tma_q_atom, tma_q = self._make_q_tma(m_q, q_layout)
        box_bytes = self.page_block * D_QK
        bulk_atom = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), Uint8,
                                        num_bits_per_copy=box_bytes * 8)  # fmt: skip

        @cute.struct
        class SharedStorage:
            kv_full_empty: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            fp8_full_empty: cute.struct.MemRange[cutlass.Int64, self.fp8_stages * 2]
            q_bar: cute.struct.MemRange[cutlass.Int64, 1]
            red: cute.struct.MemRange[Float32, 2 * 4 * self.rows_per_wg]
            alpha: cute.struct.MemRange[Float32, self.rows]
            row_max: cute.struct.MemRange[Float32, self.rows]
            row_sum: cute.struct.MemRange[Float32, self.rows]
            s_kv: cute.struct.Align[
                cute.struct.MemRange[self.mma_dtype, cute.cosize(kv_layout)], 1024
            ]
            s_q: cute.struct.Align[
                cute.struct.MemRange[self.mma_dtype, cute.cosize(q_layout)], 1024
            ]
            s_p: cute.struct.Align[
                cute.struct.MemRange[self.mma_dtype, cute.cosize(p_layout)], 1024
            ]
            s_fp8: cute.struct.Align[cute.struct.MemRange[Uint8, cute.cosize(fp8_layout)], 128]
            tok_scale: cute.struct.MemRange[Float32, TILE * self.stages]

        self.shared_storage = SharedStorage
        self.kernel(
            mma_s, mma_o, tma_q_atom, tma_q, bulk_atom, m_kv, m_scale,
            kv_layout, vt_layout, q_layout, p_layout, fp8_layout,
            m_bt, m_seq, m_out, m_lse, m_part_o, m_part_lse,
            scale_log2, q_len, num_heads, num_splits, page_size,
        ).launch(
            grid=[row_blocks, num_splits, batch], block=[self.threads, 1, 1], stream=stream,
            min_blocks_per_mp=1,
        )  # fmt: skip

    # -- device side --------------------------------------------------------------------------

    @cute.kernel
    def kernel(
        self,
        mma_s: cute.TiledMma,
        mma_o: cute.TiledMma,
        tma_q_atom: cute.CopyAtom,
        tma_q: cute.Tensor,
        bulk_atom: cute.CopyAtom,
        m_kv: cute.Tensor,
        m_scale: cute.Tensor,
        kv_layout: cute.ComposedLayout,
        vt_layout: cute.ComposedLayout,
        q_layout: cute.ComposedLayout,
        p_layout: cute.ComposedLayout,
        fp8_layout: cute.Layout,
        m_bt: cute.Tensor,
        m_seq: cute.Tensor,
        m_out: cute.Tensor,
        m_lse: cute.Tensor,
        m_part_o: cute.Tensor,
        m_part_lse: cute.Tensor,
        scale_log2: Float32,
        q_len: Int32,
        num_heads: Int32,
        num_splits: Int32,
        page_size: Int32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        rb, split, b = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()

        rows_per_req = q_len * num_heads
        row0 = rb * self.rows
        seq_len, start, end, n_tiles = self._split_tiles(m_seq, b, split, num_splits)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        s_kv, s_q, s_p, q_bar, red, s_alpha, s_max, s_sum = self._consumer_smem(
            storage, kv_layout, q_layout, p_layout
        )
        s_fp8 = storage.s_fp8.get_tensor(fp8_layout)
        # per-token scales of the bf16 ring's tiles (token, stage); unused with one scale
        s_tok_scale = storage.tok_scale.get_tensor(cute.make_layout((TILE, self.stages)))

        # bf16 ring: filled by the converter groups' threads, emptied by the consumer's 128.
        kv_pipe = pipeline.PipelineAsync.create(
            barrier_storage=storage.kv_full_empty.data_ptr(),
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, 128 * self.converter_wgs
            ),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128),
            defer_sync=True,
        )
        # FP8 ring: bulk copies complete its full barriers; the converter warps empty it.
        fp8_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.fp8_full_empty.data_ptr(),
            num_stages=self.fp8_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 4 * self.converter_wgs),
            tx_count=TILE * D_QK,
            defer_sync=True,
        )
        self._init_query_barrier(warp, q_bar)
        # the output's staging (bf16 rows), once the query block (bf16 or f16) is spent
        s_stage = cute.recast_ptr(storage.s_q.data_ptr(), dtype=BFloat16)
        q_flat = storage.s_q.get_tensor(cute.make_layout(self.rows * D_QK))

        if warp >= self.producer_warp:
            cute.arch.warpgroup_reg_dealloc(40)
            if warp == self.producer_warp:
                self._load(tma_q_atom, tma_q, bulk_atom, m_kv, s_q, s_fp8, q_bar, fp8_pipe,
                           m_bt, b, rows_per_req, row0, start, end, n_tiles, page_size)  # fmt: skip
        elif warp >= self.converter_warp:
            # registers per thread: consumer 232 + converters + loader 40 <= 512 (a CTA's
            # 64 K over 128-thread groups); one converter group holds a 288-byte share
            cute.arch.warpgroup_reg_dealloc(152 if self.converter_wgs == 1 else 112)
            self._convert(s_fp8, s_kv, s_tok_scale, fp8_pipe, kv_pipe, m_scale, m_bt, b,
                          start, end, n_tiles, page_size, tidx - 128)  # fmt: skip
        else:
            cute.arch.warpgroup_reg_alloc(232)
            self._consume_fp8(
                mma_s, mma_o, s_kv, s_q, s_p, vt_layout, q_bar, kv_pipe, red, s_alpha, s_max,
                s_sum, m_out, m_lse, m_part_o, m_part_lse, m_scale, s_tok_scale, scale_log2,
                q_len, num_heads, num_splits, b, split, rows_per_req, row0, start, end,
                seq_len, n_tiles, tidx, warp, lane, s_stage, q_flat,
            )  # fmt: skip

    @cute.jit
    def _consume_fp8(
        self, mma_s, mma_o, s_kv, s_q, s_p, vt_layout, q_bar, kv_pipe, red, s_alpha, s_max,
        s_sum, m_out, m_lse, m_part_o, m_part_lse, m_scale, s_tok_scale, scale_log2, q_len,
        num_heads, num_splits, b, split, rows_per_req, row0, start, end, seq_len, n_tiles,
        tidx, warp, lane, s_stage, q_flat,
    ):  # fmt: skip
        """The bf16 kernel's consumer over tiles of raw e4m3 values: the scale is applied
        here, in float32 (per token from ``s_tok_scale``, or the tensor's). With f16 products
        it first converts the query block (``q_flat``) and takes its scale off the scores."""
        if cutlass.const_expr(self.mma_dtype is Float16):
            cute.arch.mbarrier_wait(q_bar, 0)  # (the consumer's own wait then passes at once)
            query_to_f16(q_flat, tidx, self.consumer_threads)
            cute.arch.barrier(barrier_id=3, number_of_threads=self.consumer_threads)
            scale_log2 = scale_log2 * (1.0 / Q_F16_SCALE)
        if cutlass.const_expr(self.per_token):
            scaling = {"s_tok_scale": s_tok_scale}
        else:
            kv_scale = m_scale[0]
            scale_log2 = scale_log2 * kv_scale
            scaling = {"out_scale": kv_scale}
        self._consume(
            mma_s, mma_o, s_kv, s_q, s_p, vt_layout, q_bar, kv_pipe, red, s_alpha, s_max, s_sum,
            m_out, m_lse, m_part_o, m_part_lse, scale_log2, q_len, num_heads, num_splits, b,
            split, rows_per_req, row0, start, end, seq_len, n_tiles, tidx, warp, lane,
            s_stage=s_stage, **scaling,
        )  # fmt: skip

    @cute.jit
    def _load(
        self, tma_q_atom, tma_q, bulk_atom, m_kv, s_q, s_fp8, q_bar, fp8_pipe, m_bt, b,
        rows_per_req, row0, start, end, n_tiles, page_size,
    ):  # fmt: skip
        """The loader warp: the query block, then every FP8 tile of the split."""
        self._load_query(tma_q_atom, tma_q, s_q, q_bar, b, rows_per_req, row0)
        self._load_tiles(bulk_atom, m_kv, s_fp8, fp8_pipe, m_bt, b, start, end, n_tiles,
                         page_size)  # fmt: skip

    @cute.jit
    def _convert(
        self, s_fp8, s_kv, s_tok_scale, fp8_pipe, kv_pipe, m_scale, m_bt, b, start, end,
        n_tiles, page_size, ct,
    ):  # fmt: skip
        """A converter thread: its share of each FP8 slot -> the same values in the bf16 tile.

        Thread ``ct`` owns token ``ct // parts`` and part ``ct % parts`` of its 576 values
        (``parts`` = 2 per converter warp group): all its 16-byte shared loads first, then
        per chunk of 16 an exact widening (``widen_e4m3x2``) and one store into the swizzled
        bf16 tile. The scale stays out: with a scale per token, part 0's thread writes its
        token's (0 past the split's end, read a tile ahead) beside the tile for the consumer.
        Tokens past the end are not zeroed: any byte widens to a finite value, and the
        consumer gives those tokens zero weight.
        """
        parts = 2 * self.converter_wgs
        token = ct // parts
        part = ct % parts
        per_part = D_QK // parts
        chunks = per_part // _CHUNK
        scale = Float32(0.0)
        if cutlass.const_expr(self.per_token):
            scale = self._token_scale(m_scale, m_bt, b, start + token, end, page_size)
        r8 = cute.make_rmem_tensor((per_part,), Uint8)
        words = cute.recast_tensor(r8, Uint32)  # four e4m3 values each
        r32 = cute.make_rmem_tensor((_CHUNK // 2,), Uint32)  # a chunk as 16-bit pairs
        r16 = cute.recast_tensor(r32, self.mma_dtype)
        in_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                self.fp8_stages)  # fmt: skip
        out_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                 self.stages)  # fmt: skip
        for tile in cutlass.range(n_tiles, unroll=1):
            tok_scale = scale
            if cutlass.const_expr(self.per_token):  # the next tile's, in flight meanwhile
                pos = start + tile * TILE + token
                scale = self._token_scale(m_scale, m_bt, b, pos + TILE, end, page_size)
            fp8_pipe.consumer_wait(in_state)
            src = cute.local_tile(s_fp8[token, None, in_state.index], (per_part,), (part,))
            cute.autovec_copy(src, r8)
            fp8_pipe.consumer_release(in_state)  # the slot's bytes are in registers now
            kv_pipe.producer_acquire(out_state)
            if cutlass.const_expr(self.per_token):
                if part == 0:
                    s_tok_scale[token, out_state.index] = tok_scale
            dst = s_kv[token, None, out_state.index]
            live = start + tile * TILE + token < end
            for k in cutlass.range_constexpr(chunks):
                for w in cutlass.range_constexpr(_CHUNK // 4):
                    widen_word(r32, w, words[k * (_CHUNK // 4) + w], live,
                               self.mma_dtype is Float16)  # fmt: skip
                cute.autovec_copy(r16, cute.local_tile(dst, (_CHUNK,), (part * chunks + k,)))
            # the wgmma reading this tile is in the async proxy
            cute.arch.fence_proxy(
                cute.arch.ProxyKind.async_shared, space=cute.arch.SharedSpace.shared_cta
            )
            kv_pipe.producer_commit(out_state)
            in_state.advance()
            out_state.advance()
