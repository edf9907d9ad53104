"""Absorbed-MLA decode over an FP8 (e4m3) latent cache for Hopper (SM90), 64 query rows per
CTA: the pairs kernel (``cute_seesaw_pairs.py``) fed through a ring of FP8 tiles.

Over an FP8 cache the tokens-on-M kernel (``cute_decode_fp8.py``) takes at most 32 rows, so
a request of 64 or 128 rows (64 or 128 heads, DeepSeek-V3's and Kimi's decode) ran as two or
four blocks of 32 rows, each streaming the whole cache. Here one CTA owns 64 rows, as the
bf16 pairs kernel does, and its consumers are that kernel's, unchanged but for the scale:
1.33-1.36x faster at 64 and 128 heads on the H200 (docs/mla.md).

wgmma multiplies 16-bit types (FP8 by FP8 would need an FP8 query and P), so every FP8 tile
is widened in shared memory first: to f16 by default (``mma_f16``), one hardware conversion
per pair of values, 10-13 % faster than bf16, which has no such conversion. What makes the
room for both rings: the 16-bit ring holds one pair of 32-token tiles (two 36 KiB stages), and
the look-ahead lives in the FP8 ring behind it (``fp8_stages`` slots of 32 tokens, 18 KiB
each), half the bytes of the same tokens widened. Shared memory: query 72 KiB + 16-bit
ring 72 KiB + ``P_A`` 8 KiB + two FP8 slots 36 KiB (four fit, and measured slower). Per stage
the parts (lo: dims 0-255, hi: dims 256-575) are filled and released as in the bf16 kernel, so
a consumer's release to the part's refill is a widening from shared memory, not a load from
HBM (1.6-2.9 us under full traffic, docs/mla.md).

The producer warp group (most of its registers given to the consumers) does the rest:

* its first warp loads the query block, then bulk-copies each FP8 tile (a page's tokens are
  contiguous 576-byte rows: one ``cp.async.bulk`` per page block, with its per-token scales
  beside it) into the FP8 ring, as soon as the slot's last reader is done;
* all four warps widen each part, in the order the consumers release them (A lo, A hi, B hi,
  B lo), exactly (the tile holds the cached values: ``e4m3x2_to_f16x2``, or ``widen_e4m3x2``
  for bf16), and copy a tile's 32 scales beside its stage.

The widening is what this kernel's time is made of: without it (``ablation="no_widen"``) it
would take 152-164 us at 64 heads instead of 201 us (f16; 222 us widening to bf16). Giving
the widening threads 72 registers instead of 40 (the consumers keep 216) took 5-7 % off; a
third bf16 stage, so that a tile is widened a pair ahead instead of just in time, was slower
(docs/mla.md). With f16 products the query is converted in shared memory once per CTA, times
``Q_F16_SCALE`` so that bf16 queries up to about 1e6 stay in f16's range.

The scale is applied by the consumers in float32 (``cute_seesaw_pairs``'s ``tok_scale`` /
``kv_scale``): per token to the scores and to the probabilities that meet V; per tensor to
the scores and to the output.

Needs ``nvidia-cutlass-dsl`` (4.3) and an SM90 GPU; bf16 query, e4m3 cache with a float32
scale per tensor (one element) or per token. The launch wrapper is ``cute_decode.mla_decode``
(plan layout ``"pairs"`` with ``fp8``, the plan's choice above 32 rows).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils as utils
from cutlass import BFloat16, Float16, Float32, Int32, Uint8, Uint32
from cutlass.cute.nvgpu import cpasync

from .cute_decode_fp8 import Q_F16_SCALE, copy_page_scales, query_to_f16, widen_word
from .cute_seesaw import _BAR_CONSUMERS, _PAIR
from .cute_seesaw_pairs import _RELEASERS, D_QK, PIECE, ROWS, MlaDecodeSeesawPairsSm90

FP8_TILE = 32  # tokens per tile: two 16-bit stages of them leave room for the FP8 ring
_CHUNK = 16  # e4m3 values a thread widens at a time (one 16-byte shared load)
SMEM_BYTES = 227 * 1024  # an SM90 CTA's shared memory
_WIDENERS = 128  # the producer warp group's threads, all of which widen


class MlaDecodeSeesawPairsFp8Sm90(MlaDecodeSeesawPairsSm90):
    """One compiled variant: page copy size, FP8 ring depth, split output or not, LSE or not,
    scale per token or per tensor."""

    def __init__(
        self, page_block: int, fp8_stages: int, split: bool, write_lse: bool, per_token: bool,
        ablation: str = "", widener_regs: int = 72, mma_f16: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(page_block, split, write_lse, tile=FP8_TILE, lazy_rescale=True)
        if fp8_stages < 2:
            raise ValueError(f"fp8_stages={fp8_stages}: the FP8 ring needs two slots or more")
        # Benchmark-only: "no_widen" leaves the 16-bit ring as it is (the results are wrong), so
        # what the widening costs shows.
        if ablation not in ("", "no_widen"):
            raise ValueError(f"the FP8 pairs kernel has no ablation {ablation!r}")
        self.ablation = ablation
        self.ring_pairs = 1  # one pair of 16-bit stages; the FP8 ring holds the look-ahead
        self.stages = 2
        # registers per thread after setmaxnreg: 2 x 128 consumers + 128 wideners share the
        # 168 x 384 the launch holds (232 + 40, 224 + 56 or 216 + 72)
        if widener_regs not in (40, 56, 72):
            raise ValueError(f"widener_regs={widener_regs}: 40, 56 or 72")
        self.widener_regs = widener_regs
        self.consumer_regs = (168 * 384 - 128 * widener_regs) // 256
        self.fp8_stages = fp8_stages
        self.per_token = per_token
        # f16 products: the widening is one conversion per pair of values instead of about
        # four integer ops and a multiply (e4m3 values are exact in f16 as in bf16; the query
        # is converted once per CTA, P is finer). Tokens past the split's end are widened as
        # zeros, since a NaN byte would reach the products as NaN here.
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
        mmas, (kv_layout, v_layout, q_layout, p_layout) = self._mmas_and_layouts()
        fp8_layout = cute.make_layout((self.tile, D_QK, self.fp8_stages),
                                      stride=(D_QK, 1, self.tile * D_QK))  # fmt: skip
        tma_q_atom, tma_q = self._make_q_tma(m_q, q_layout)
        bulk_atom = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), Uint8,
                                        num_bits_per_copy=self.page_block * D_QK * 8)  # fmt: skip
        scale_atom = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), Float32,
                                         num_bits_per_copy=self.page_block * 32)  # fmt: skip

        @cute.struct
        class SharedStorage:
            full: cute.struct.MemRange[cutlass.Int64, self.parts * self.stages]
            empty: cute.struct.MemRange[cutlass.Int64, self.parts * self.stages]
            fp8_full: cute.struct.MemRange[cutlass.Int64, self.fp8_stages]
            fp8_empty: cute.struct.MemRange[cutlass.Int64, self.fp8_stages]
            q_bar: cute.struct.MemRange[cutlass.Int64, 1]
            m0: cute.struct.MemRange[Float32, ROWS]
            scale0: cute.struct.MemRange[Float32, ROWS]
            m1: cute.struct.MemRange[Float32, ROWS]
            scale1: cute.struct.MemRange[Float32, ROWS]
            row_sum: cute.struct.MemRange[Float32, 2 * ROWS]
            s_kv: cute.struct.Align[
                cute.struct.MemRange[self.mma_dtype, cute.cosize(kv_layout)], 1024
            ]
            s_q: cute.struct.Align[
                cute.struct.MemRange[self.mma_dtype, cute.cosize(q_layout)], 1024
            ]
            s_pa: cute.struct.Align[
                cute.struct.MemRange[self.mma_dtype, cute.cosize(p_layout)], 1024
            ]
            s_fp8: cute.struct.Align[cute.struct.MemRange[Uint8, cute.cosize(fp8_layout)], 128]
            # per-token scales: the stages' (token, stage), and bulk-copied beside each FP8
            # tile (token, slot); after the big blocks, which align to 1 KiB
            tok_scale: cute.struct.MemRange[Float32, FP8_TILE * self.stages]
            slot_scale: cute.struct.Align[
                cute.struct.MemRange[Float32, FP8_TILE * self.fp8_stages], 16
            ]

        self.shared_storage = SharedStorage
        if cutlass.const_expr(SharedStorage.size_in_bytes() > SMEM_BYTES):
            raise ValueError(f"the FP8 pairs decode needs {SharedStorage.size_in_bytes()} bytes "
                             f"of shared memory, more than the SM's {SMEM_BYTES}")  # fmt: skip
        self.kernel(
            *mmas, tma_q_atom, tma_q, bulk_atom, scale_atom, m_kv, m_scale,
            kv_layout, v_layout, q_layout, p_layout, fp8_layout,
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
        mma_s0: cute.TiledMma,
        mma_s_rs: cute.TiledMma,
        mma_o: cute.TiledMma,
        mma_o_rs: cute.TiledMma,
        tma_q_atom: cute.CopyAtom,
        tma_q: cute.Tensor,
        bulk_atom: cute.CopyAtom,
        scale_atom: cute.CopyAtom,
        m_kv: cute.Tensor,
        m_scale: cute.Tensor,
        kv_layout: cute.ComposedLayout,
        v_layout: cute.ComposedLayout,
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

        rows_per_req = q_len * num_heads
        row0 = rb * ROWS
        seq_len, start, end, n_tiles = self._split_tiles(m_seq, b, split, num_splits)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        s_kv = storage.s_kv.get_tensor(kv_layout.outer, swizzle=kv_layout.inner)
        s_q = storage.s_q.get_tensor(q_layout.outer, swizzle=q_layout.inner)
        s_pa = storage.s_pa.get_tensor(p_layout.outer, swizzle=p_layout.inner)
        s_fp8 = storage.s_fp8.get_tensor(fp8_layout)
        tok_scale = storage.tok_scale.get_tensor(cute.make_layout((FP8_TILE, self.stages)))
        slot_scale = storage.slot_scale.get_tensor(cute.make_layout((FP8_TILE, self.fp8_stages)))
        full = storage.full.data_ptr()
        empty = storage.empty.data_ptr()
        fp8_full = storage.fp8_full.data_ptr()
        fp8_empty = storage.fp8_empty.data_ptr()
        q_bar = storage.q_bar.data_ptr()
        if warp == 0:
            with cute.arch.elect_one():
                for i in cutlass.range_constexpr(self.parts * self.stages):
                    cute.arch.mbarrier_init(full + i, _WIDENERS)
                    cute.arch.mbarrier_init(empty + i, _RELEASERS)
                for i in cutlass.range_constexpr(self.fp8_stages):
                    cute.arch.mbarrier_init(fp8_full + i, 1)  # the loader's expect-tx
                    cute.arch.mbarrier_init(fp8_empty + i, _WIDENERS)
        self._init_query_barrier(warp, q_bar)  # fences the inits and syncs the CTA

        if warp >= self.producer_warp:
            cute.arch.warpgroup_reg_dealloc(self.widener_regs)
            self._load_and_widen(
                tma_q_atom, tma_q, bulk_atom, scale_atom, m_kv, m_scale, s_q, s_fp8, s_kv,
                tok_scale, slot_scale, q_bar,
                full, empty, fp8_full, fp8_empty, m_bt, b, rows_per_req, row0, start, end,
                n_tiles, page_size, tidx - 2 * 128, warp,
            )  # fmt: skip
        else:
            cute.arch.warpgroup_reg_alloc(self.consumer_regs)
            # the scale per token goes to the consumers; one per tensor to the scores and
            # the output (the query's f16 scale, if any, comes off the scores too)
            score_scale = scale_log2 * self._score_factor()
            scaling = {"tok_scale": tok_scale}
            if cutlass.const_expr(not self.per_token):
                kv_scale = m_scale[0]
                score_scale = score_scale * kv_scale
                scaling = {"kv_scale": kv_scale}
            self._consume(
                mma_s, mma_s0, mma_s_rs, mma_o, mma_o_rs, s_kv, s_q, s_pa, v_layout, p_layout,
                q_bar, full, empty, storage, m_out, m_lse, m_part_o, m_part_lse, score_scale,
                q_len, num_heads, num_splits, b, split, rows_per_req, row0, start, end, seq_len,
                n_tiles, tidx, warp, **scaling,
            )  # fmt: skip

    def _score_factor(self) -> float:
        """What the scores are multiplied by besides the softmax scale: undoes the f16
        query's scale."""
        return 1.0 / Q_F16_SCALE if self.mma_dtype is Float16 else 1.0

    @cute.jit
    def _prepare_query(self, storage, tidx):
        """With f16 products, the query block (copied as it is: bf16 bits) becomes f16 times
        ``Q_F16_SCALE`` in place, eight values a thread at a time over both consumer groups,
        before either scores."""
        if cutlass.const_expr(self.mma_dtype is Float16):
            query_to_f16(storage.s_q.get_tensor(cute.make_layout(ROWS * D_QK)), tidx, _PAIR)
            cute.arch.barrier(barrier_id=_BAR_CONSUMERS, number_of_threads=_PAIR)

    @cute.jit
    def _load_and_widen(
        self, tma_q_atom, tma_q, bulk_atom, scale_atom, m_kv, m_scale, s_q, s_fp8, s_kv,
        tok_scale, slot_scale, q_bar, full, empty, fp8_full, fp8_empty, m_bt, b, rows_per_req,
        row0, start, end, n_tiles, page_size, wt, warp,
    ):  # fmt: skip
        """The producer warp group (``wt``: its thread 0-127). Its first warp loads the query
        and keeps the FP8 ring full; all four widen every part of every tile into the 16-bit
        ring as soon as the consumers have released it.

        Thread ``wt`` widens token ``wt // 4`` of each part, 16 dims in every 64 (``wt % 4``
        picks which). With a scale per token, the first 32 threads copy the tile's scales
        from its FP8 slot to the stage with the tile's first part (0 past the split's end): a
        tile's scorer has exponentiated it before it releases any of its parts, so the
        stage's scales are free by then. Nothing here waits on a global load: block-table
        entries are read a tile before their copies are issued, and the scales come with the
        tile.
        """
        loader = warp == self.producer_warp
        fs = self.fp8_stages
        ahead = cute.make_rmem_tensor((self.copies_per_tile,), Int32)  # the next tile's boxes
        first = Int32(0)  # the split's first box: what a box past its end copies
        if n_tiles > 0:  # (a split with no tiles may start past the block table)
            first = (m_bt[b, start // page_size] * page_size + start % page_size) // self.page_block
        if loader:
            self._load_query(tma_q_atom, tma_q, s_q, q_bar, b, rows_per_req, row0)
            self._fp8_boxes(ahead, m_bt, b, start, end, page_size, first)
            for t in cutlass.range(cutlass.min(n_tiles, fs), unroll=1):
                self._load_fp8_tile(bulk_atom, scale_atom, m_kv, m_scale, s_fp8, slot_scale,
                                    fp8_full, ahead, m_bt, b, start, end, page_size, first, t)  # fmt: skip
        token = wt // 4
        quarter = wt % 4
        n_pairs = (n_tiles + 1) // 2
        for p in cutlass.range(n_pairs, unroll=1):
            for which, part in self.load_order:  # A lo, A hi, B hi, B lo: as they free up
                tile = 2 * p + which
                if tile < n_tiles:
                    slot = self.parts * which + part
                    f_slot = tile % fs
                    if p >= 1:  # released by the previous pair's readers
                        cute.arch.mbarrier_wait(empty + slot, self._phase(p - 1))
                    if cutlass.const_expr(part == which):  # the tile's first part (A lo, B hi)
                        cute.arch.mbarrier_wait(fp8_full + f_slot, (tile // fs) % 2)
                        if cutlass.const_expr(self.per_token):
                            if wt < FP8_TILE:
                                live = start + tile * self.tile + wt < end
                                tok_scale[wt, which] = Float32(cutlass.select_(
                                    live, slot_scale[wt, f_slot], Float32(0.0)))  # fmt: skip
                    if cutlass.const_expr(self.ablation != "no_widen"):
                        live = start + tile * self.tile + token < end
                        self._widen_part(s_fp8, s_kv, f_slot, which, part, token, quarter, live)
                    # the wgmma reading this part is in the async proxy
                    cute.arch.fence_proxy(
                        cute.arch.ProxyKind.async_shared, space=cute.arch.SharedSpace.shared_cta
                    )
                    cute.arch.mbarrier_arrive(full + slot)
                    if cutlass.const_expr(part != which):  # its last part: the FP8 slot is read
                        cute.arch.mbarrier_arrive(fp8_empty + f_slot)
                        if loader and tile + fs < n_tiles:
                            cute.arch.mbarrier_wait(fp8_empty + f_slot, (tile // fs) % 2)
                            self._load_fp8_tile(
                                bulk_atom, scale_atom, m_kv, m_scale, s_fp8, slot_scale,
                                fp8_full, ahead, m_bt, b, start, end, page_size, first, tile + fs,
                            )  # fmt: skip

    @cute.jit
    def _fp8_boxes(self, boxes, m_bt, b, tile_start, end, page_size, first):
        """The box (page block) index of each copy of the tile at ``tile_start``; ``first``
        for a block wholly past the split's end. Read early, used a tile later."""
        for c in cutlass.range_constexpr(self.copies_per_tile):
            pos = tile_start + c * self.page_block
            page = m_bt[b, cutlass.max(cutlass.min(pos, end - 1), 0) // page_size]
            box = (page * page_size + pos % page_size) // self.page_block
            if pos >= end:
                box = first
            boxes[c] = box

    @cute.jit
    def _load_fp8_tile(
        self, bulk_atom, scale_atom, m_kv, m_scale, s_fp8, slot_scale, fp8_full, boxes, m_bt,
        b, start, end, page_size, first, tile,
    ):  # fmt: skip
        """Bulk-copy the split's FP8 tile ``tile`` (its boxes in ``boxes``) into its slot, one
        copy per page block, and with a scale per token the block's scales beside it; then
        read the next tile's boxes into ``boxes``. A block past the split's end copies the
        split's first block (same byte count, never used: those tokens get zero weight)."""
        box_bytes = self.page_block * D_QK
        slot = tile % self.fp8_stages
        s_boxes = cute.make_tensor(  # (box bytes, copy, slot): each box is contiguous
            s_fp8.iterator,
            cute.make_layout((box_bytes, self.copies_per_tile, self.fp8_stages),
                             stride=(1, box_bytes, self.tile * D_QK)),
        )  # fmt: skip
        tx = self.tile * D_QK
        if cutlass.const_expr(self.per_token):
            tx += self.tile * 4
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(fp8_full + slot, tx)
        base = m_kv.iterator.toint()
        for c in cutlass.range_constexpr(self.copies_per_tile):
            box = boxes[c]
            g_box = cute.make_tensor(
                cute.make_ptr(Uint8, base + cutlass.Int64(box) * box_bytes,
                              cute.AddressSpace.gmem, assumed_align=16),
                cute.make_layout(box_bytes),
            )  # fmt: skip
            src, dst = cpasync.group_bulk_copy_modes(g_box, s_boxes[None, c, slot])
            with cute.arch.elect_one():  # one bulk copy, not one per lane
                cute.copy(bulk_atom, src, dst, mbar_ptr=fp8_full + slot)
            if cutlass.const_expr(self.per_token):  # a page block's scales are contiguous too
                copy_page_scales(scale_atom, m_scale, slot_scale, self.page_block, box, c, slot,
                                 fp8_full + slot)  # fmt: skip
        self._fp8_boxes(boxes, m_bt, b, start + (tile + 1) * self.tile, end, page_size, first)

    @cute.jit
    def _widen_part(
        self, s_fp8, s_kv, f_slot, stage, part: cutlass.Constexpr, token, quarter, live
    ):  # fmt: skip
        """One thread's share of a part: token ``token``'s 16 dims ``quarter`` of each 64-dim
        piece, from the FP8 slot into the 16-bit stage (every load first, then widen and
        store). With f16 products a token past the split's end (not ``live``) is zeros."""
        first, last = self.part_pieces[part]
        pieces = last - first
        per_piece = PIECE // _CHUNK
        r8 = cute.make_rmem_tensor((_CHUNK, pieces), Uint8)
        words = cute.recast_tensor(r8, Uint32)  # (4, pieces): four e4m3 values each
        src = s_fp8[token, None, f_slot]
        for j in cutlass.range_constexpr(pieces):
            chunk = (first + j) * per_piece + quarter
            cute.autovec_copy(cute.local_tile(src, (_CHUNK,), (chunk,)), r8[None, j])
        r32 = cute.make_rmem_tensor((_CHUNK // 2,), Uint32)  # a chunk as 16-bit pairs
        r16 = cute.recast_tensor(r32, self.mma_dtype)
        dst = s_kv[token, None, stage]
        for j in cutlass.range_constexpr(pieces):
            chunk = (first + j) * per_piece + quarter
            for w in cutlass.range_constexpr(_CHUNK // 4):
                widen_word(r32, w, words[w, j], live, self.mma_dtype is Float16)
            cute.autovec_copy(r16, cute.local_tile(dst, (_CHUNK,), (chunk,)))
