"""Absorbed-MLA decode for Hopper (SM90) in CuTe DSL: TMA loads, wgmma, tokens on the M axis.

One CTA owns one block of ``ROWS`` query rows (a row is a (query token, head) pair) of one
request and streams one KV split of that request's latent cache, 64 tokens (one tile) at a
time. The tile is the MMA's M dimension in both products, so 16 or 32 heads need no padding
to the 64-row minimum of ``wgmma``:

* ``s^T[64 tok, rows] = kv[64 tok, 576] @ q[rows, 576]^T``: A is the KV tile, B the query
  block, both K-major in shared memory.
* online softmax down the token axis (a column max per row: registers, warp shuffles, and a
  4-warp exchange through shared memory), ``p^T`` written to shared memory in bf16.
* ``o^T[512, rows] += kv_c^T[512, 64 tok] @ p^T``: A is the same KV tile read through its
  transpose (the 512 latent dims are contiguous, an MN-major operand), so V costs no second
  load.

Warp roles: ``CONSUMER_WGS`` warp groups compute (with two, each owns half of the rows in the
first product and half of the 512 output dims in the second, so neither product is done
twice), and one extra producer warp issues the TMA loads into a ring of ``STAGES`` tiles,
reading the block table itself. A page of ``page_size >= 64`` tokens holds whole tiles; smaller
pages fill a tile with ``64 / page_size`` copies. Output: the final bf16 rows (+ LSE) when
there is one split, otherwise fp32 partials and base-2 LSEs in the layout the Triton merge
kernel reads.

Needs ``nvidia-cutlass-dsl`` (4.3) and an SM90 GPU; ``tokenspeed.mla.catalog`` registers it as
a SPECIALIZED candidate only when both are present. bf16 query and cache (an FP8 cache takes
``cute_decode_fp8_regs.py``, which widens it in the consumers' registers).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup

from tokenspeed.kernels.cute_ops.common import (
    L2_EVICT_FIRST,
    accumulator_column,
    accumulator_slot,
    column_sum,
    cute_tensor,
    merge_row_max,
    staged_rows,
    store_staged_rows,
)

from .configs import CUTE_TILE, cute_decode_plan

TILE = CUTE_TILE  # KV tokens per tile: the wgmma M of both products
D_LATENT = 512
D_ROPE = 64
D_QK = D_LATENT + D_ROPE
_NEG_INF = -math.inf


@cute.jit
def running_max(
    acc_s, m_i, l_i, red, rows: cutlass.Constexpr, warp_in_wg, wg, lane, parity
):  # fmt: skip
    """A tokens-on-M tile's step of the online softmax for one warp group: each row's max over
    the tile's tokens (``acc_s``: scaled and masked scores), then ``merge_row_max`` across
    its four warps through ``red[row, warp, group, parity]`` and the group's named barrier
    ``1 + wg``. Returns ``(alpha, m_use)``."""
    tile_max = cute.make_rmem_tensor((rows // 4,), Float32)
    tile_max.fill(_NEG_INF)
    for i in cutlass.range_constexpr(cute.size(acc_s)):
        j = accumulator_slot(i, rows)
        tile_max[j] = cute.arch.fmax(tile_max[j], acc_s[i])
    return merge_row_max(tile_max, m_i, l_i, red, (wg, parity), warp_in_wg, lane, 1 + wg)


class KvRingProducer:
    """What both CuTe decode kernels share: the TMA copies of the query block and of the paged
    KV tiles, and the producer warp that fills the ring.

    A kernel sets ``rows`` (query rows per CTA), ``page_block`` (tokens per TMA box: the page,
    or the tile for larger pages), ``copies_per_tile`` (``tile // page_block``), ``stages`` and
    ``evict_first`` (load KV tiles with the L2 evict-first hint, FlashMLA's choice: each tile
    is read by the CTAs of one request at about the same time and then never again).

    ``page_prefetch`` (default on): the producer reads the block-table entries of the next
    tile before it waits for a free stage, so the read has landed when the stage frees and
    the copies go out at once; off, each tile's copies wait for a block-table read issued
    only once the stage is free (a global load under full memory traffic, on every tile's
    load latency).
    """

    page_prefetch = True
    tile = TILE  # KV tokens per tile the consumers take at a time (splits stay whole 64s)

    @cute.jit
    def _make_tmas(self, m_q: cute.Tensor, m_kv: cute.Tensor, q_layout, kv_layout):
        """TMA atoms: one box of ``page_block`` tokens x 576 dims of a KV stage (same strides as
        the stage), and the ``rows`` x 576 query block."""
        kv_stage = cute.slice_(kv_layout, (None, None, 0))
        box_outer = cute.composition(
            kv_stage.outer, cute.make_layout((self.page_block, D_QK), stride=(1, TILE))
        )
        box_layout = cute.make_composed_layout(kv_stage.inner, 0, box_outer)
        tma_kv_atom, tma_kv = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), m_kv, box_layout, (self.page_block, D_QK)
        )
        tma_q_atom, tma_q = self._make_q_tma(m_q, q_layout)
        return tma_kv_atom, tma_kv, tma_q_atom, tma_q

    @cute.jit
    def _make_q_tma(self, m_q: cute.Tensor, q_layout):
        """The TMA atom of the ``rows`` x 576 query block."""
        q_one = cute.slice_(q_layout, (None, None, 0))
        return cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), m_q, q_one, (self.rows, D_QK)
        )

    def _kv_load_hint(self) -> dict[str, Any]:
        """The KV copies' extra TMA arguments: the evict-first L2 policy, or none. (The
        operand must be an Int64 carrying an IR value; a Python constant is rejected.)"""
        if not self.evict_first:
            return {}
        return {"cache_policy": cutlass.Int64(cutlass.Int64(L2_EVICT_FIRST).ir_value())}

    @cute.jit
    def _split_tiles(self, m_seq: cute.Tensor, b: Int32, split: Int32, num_splits: Int32):
        """This CTA's share of request ``b``'s cache: ``(seq_len, start, end, n_tiles)``.

        Splits are whole tiles and follow the request's own length (read on the device), so
        the launch needs no host sync; a split past the end has no tiles.
        """
        seq_len = m_seq[b]
        per_split = (((seq_len + num_splits - 1) // num_splits + TILE - 1) // TILE) * TILE
        start = split * per_split
        end = cutlass.min(start + per_split, seq_len)
        n_tiles = cutlass.max((end - start + self.tile - 1) // self.tile, 0)
        return seq_len, start, end, n_tiles

    @cute.jit
    def _make_ring(self, storage, consumer_warps: int, warp: Int32, q_bar):
        """The ring's full/empty mbarriers (``consumer_warps`` releases per stage) and the
        query block's barrier, initialised before any warp takes its role."""
        kv_pipe = self._tma_pipeline(
            storage.kv_full_empty.data_ptr(), self.stages, consumer_warps, TILE * D_QK * 2
        )
        self._init_query_barrier(warp, q_bar)
        return kv_pipe

    def _tma_pipeline(self, barriers, stages: int, consumer_warps: int, tx_bytes: int):
        """A ring of ``stages`` buffers filled by one thread's TMA copies of ``tx_bytes``
        each and released by ``consumer_warps`` warps; its mbarriers at ``barriers`` are
        initialised here, made visible by the caller's fence and CTA sync."""
        return pipeline.PipelineTmaAsync.create(
            barrier_storage=barriers,
            num_stages=stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumer_warps),
            tx_count=tx_bytes,
            defer_sync=True,
        )

    @cute.jit
    def _init_query_barrier(self, warp: Int32, q_bar):
        """The query block's barrier (one arrival: the loader's expect-tx), then a fence and a
        CTA sync so every mbarrier set up before it is visible before any warp takes its role."""
        if warp == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_init(q_bar, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

    @cute.jit
    def _load_query(self, tma_q_atom, tma_q, s_q, q_bar, b, rows_per_req, row0, stage=0, arm=True):
        """One TMA copy of this CTA's ``rows`` x 576 query block into ``s_q``'s ``stage``,
        completing ``q_bar`` (which this arms with the byte count, unless its pipeline's
        acquire already has: ``arm=False``)."""
        g_q = cute.local_tile(
            cute.domain_offset((b * rows_per_req + row0, 0), tma_q), (self.rows, D_QK), (0, 0)
        )
        t_qs, t_qg = cpasync.tma_partition(
            tma_q_atom, 0, cute.make_layout(1), cute.group_modes(s_q, 0, 2),
            cute.group_modes(g_q, 0, 2),
        )  # fmt: skip
        if cutlass.const_expr(arm):
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(q_bar, self.rows * D_QK * 2)
        cute.copy(tma_q_atom, t_qg, t_qs[(None, stage)], tma_bar_ptr=q_bar)

    @cute.jit
    def _tile_boxes(self, boxes, at, m_bt, b, tile_start, end, page_size, past_end):
        """The box index of each page block of the tile at ``tile_start``, into ``boxes[at +
        c]``. A block wholly past the split's end gets ``past_end``; its block-table read is
        clamped to a valid entry, so every read is unconditional and all can be in flight at
        once (nothing waits for them until the copies are issued)."""
        for c in cutlass.range_constexpr(self.copies_per_tile):
            pos = tile_start + c * self.page_block
            page = m_bt[b, cutlass.max(cutlass.min(pos, end - 1), 0) // page_size]
            box = (page * page_size + pos % page_size) // self.page_block
            if pos >= end:
                box = past_end
            if cutlass.const_expr(self.ablation == "l2_loads"):
                box = Int32(c)  # every tile the cache's first boxes: L2 hits, not HBM
            boxes[at + c] = box

    @cute.jit
    def _produce(
        self, tma_kv_atom, tma_kv, tma_q_atom, tma_q, s_kv, s_q, q_bar, kv_pipe, m_bt, b,
        rows_per_req, row0, start, end, n_tiles, page_size,
    ):  # fmt: skip
        """The producer warp: the query block once, then every KV tile of the split."""
        self._load_query(tma_q_atom, tma_q, s_q, q_bar, b, rows_per_req, row0)
        boxes = self._kv_boxes(tma_kv_atom, tma_kv, s_kv)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        self._produce_tiles(tma_kv_atom, boxes, kv_pipe, state, m_bt, b, start, end, n_tiles,
                            page_size)  # fmt: skip

    @cute.jit
    def _kv_boxes(self, tma_kv_atom, tma_kv, s_kv):
        """The TMA-partitioned views the ring's copies go between: ``(t_kvs, t_kvg,
        n_boxes)``, the ring as (box, copy in tile, stage) and the cache as (box, box index),
        with the cache's box count."""
        s_boxes = cute.flat_divide(s_kv, (self.page_block, D_QK))
        g_boxes = cute.local_tile(tma_kv, (self.page_block, D_QK), (None, 0))
        t_kvs, t_kvg = cpasync.tma_partition(
            tma_kv_atom, 0, cute.make_layout(1), cute.group_modes(s_boxes, 0, 2),
            cute.group_modes(g_boxes, 0, 2),
        )  # fmt: skip
        return t_kvs, t_kvg, Int32(cute.size(g_boxes, mode=[2]))

    @cute.jit
    def _produce_tiles(
        self, tma_kv_atom, boxes, kv_pipe, state, m_bt, b, start, end, n_tiles, page_size
    ):
        """Copy ``n_tiles`` KV tiles of request ``b`` from token ``start`` into the ring;
        returns the ring's state after the last."""
        t_kvs, t_kvg, n_boxes = boxes
        # A box wholly past the split's end reads nothing real: point it past the cache
        # (TMA zero-fills out-of-range boxes and still counts their bytes).
        cpt = self.copies_per_tile
        ahead = cute.make_rmem_tensor((cpt,), Int32)
        if cutlass.const_expr(self.page_prefetch):
            self._tile_boxes(ahead, 0, m_bt, b, start, end, page_size, n_boxes)
        for tile in cutlass.range(n_tiles, unroll=1):
            now = cute.make_rmem_tensor((cpt,), Int32)
            if cutlass.const_expr(self.page_prefetch):
                for c in cutlass.range_constexpr(cpt):
                    now[c] = ahead[c]
                self._tile_boxes(ahead, 0, m_bt, b, start + (tile + 1) * TILE, end, page_size,
                                 n_boxes)  # fmt: skip
            kv_pipe.producer_acquire(state)
            if cutlass.const_expr(not self.page_prefetch):
                self._tile_boxes(now, 0, m_bt, b, start + tile * TILE, end, page_size, n_boxes)
            for c in cutlass.range_constexpr(cpt):
                cute.copy(
                    tma_kv_atom, t_kvg[(None, now[c])], t_kvs[(None, c, 0, state.index)],
                    tma_bar_ptr=kv_pipe.producer_get_barrier(state), **self._kv_load_hint(),
                )  # fmt: skip
            kv_pipe.producer_commit(state)
            state.advance()
        return state


class MlaDecodeSm90(KvRingProducer):
    """One compiled decode variant: row block, consumer warp groups, page copy size, stages."""

    def __init__(
        self, rows: int, consumer_wgs: int, page_block: int, stages: int, split: bool,
        write_lse: bool, ablation: str = "", evict_first: bool = False,
    ) -> None:  # fmt: skip
        if rows not in (16, 32, 64) or consumer_wgs not in (1, 2) or rows // consumer_wgs < 16:
            raise ValueError(
                f"rows={rows} must be 16/32/64, over 1 or 2 warp groups of 16+ rows each"
            )
        if page_block not in (8, 16, 32, 64):
            raise ValueError(f"page_block={page_block} must be 8, 16, 32 or 64")
        self.rows = rows
        self.wgs = consumer_wgs
        self.rows_per_wg = rows // consumer_wgs  # N of the first product, per warp group
        self.dims_per_wg = D_LATENT // consumer_wgs  # M of the second product, per warp group
        self.page_block = page_block
        self.copies_per_tile = TILE // page_block
        self.stages = stages
        self.evict_first = evict_first
        self.split = split
        self.write_lse = write_lse
        # Benchmark-only: "no_scores" / "no_values" leave one product out, "no_mma" both, so
        # timing the variants places the time spent in a tile; "l2_loads" loads every tile
        # from the cache's first boxes (L2-resident), so the ring fills at L2 speed and the
        # consumer's own time per tile shows (the results are then wrong).
        if ablation not in ("", "no_scores", "no_values", "no_mma", "l2_loads"):
            raise ValueError(f"unknown ablation {ablation!r}")
        self.ablation = ablation
        self.consumer_threads = 128 * consumer_wgs
        self.producer_warp = 4 * consumer_wgs
        # With two consumer groups the producer is a whole warp group, so that setmaxnreg can
        # move its registers to the consumers (ptxas caps a 288-thread CTA at 168 per thread).
        self.producer_threads = 128 if consumer_wgs > 1 else 32
        self.threads = self.consumer_threads + self.producer_threads

    # -- host side ----------------------------------------------------------------------------

    @cute.jit
    def __call__(
        self,
        m_q: cute.Tensor,  # [rows_total, 576] bf16, rows in (request, token, head) order
        m_kv: cute.Tensor,  # [pages * page_size, 576] bf16
        m_bt: cute.Tensor,  # [batch, max_pages] int32
        m_seq: cute.Tensor,  # [batch] int32
        m_out: cute.Tensor,  # [rows_total, 512] bf16 (one split)
        m_lse: cute.Tensor,  # [rows_total] fp32, natural log (one split)
        m_part_o: cute.Tensor,  # [rows_total * splits, 512] fp32 (several splits)
        m_part_lse: cute.Tensor,  # [rows_total * splits] fp32, base 2 (several splits)
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
        tma_kv_atom, tma_kv, tma_q_atom, tma_q = self._make_tmas(m_q, m_kv, q_layout, kv_layout)

        @cute.struct
        class SharedStorage:
            kv_full_empty: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            q_bar: cute.struct.MemRange[cutlass.Int64, 1]
            red: cute.struct.MemRange[Float32, 2 * self.wgs * 4 * self.rows_per_wg]
            alpha: cute.struct.MemRange[Float32, self.rows]
            row_max: cute.struct.MemRange[Float32, self.rows]
            row_sum: cute.struct.MemRange[Float32, self.rows]
            s_kv: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(kv_layout)], 1024]
            s_q: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(q_layout)], 1024]
            s_p: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(p_layout)], 1024]

        self.shared_storage = SharedStorage
        self.kernel(
            mma_s, mma_o, tma_kv_atom, tma_kv, tma_q_atom, tma_q,
            kv_layout, vt_layout, q_layout, p_layout,
            m_bt, m_seq, m_out, m_lse, m_part_o, m_part_lse,
            scale_log2, q_len, num_heads, num_splits, page_size,
        ).launch(
            grid=[row_blocks, num_splits, batch], block=[self.threads, 1, 1], stream=stream,
            min_blocks_per_mp=1,
        )  # fmt: skip

    @cute.jit
    def _mmas_and_layouts(self):
        """Both products' tiled MMAs (``s^T`` and ``o^T``) and the shared-memory layouts they
        read: the KV ring, its transposed V view, the query block and ``p^T``."""
        dt = BFloat16
        mma_s = sm90_utils.make_trivial_tiled_mma(
            dt, dt, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
            Float32, (1, 1, 1), tiler_mn=(TILE, self.rows_per_wg),
        )  # fmt: skip
        mma_o = sm90_utils.make_trivial_tiled_mma(
            dt, dt, warpgroup.OperandMajorMode.MN, warpgroup.OperandMajorMode.K,
            Float32, (1, 1, 1), tiler_mn=(TILE, self.rows),
        )  # fmt: skip
        row_major = utils.LayoutEnum.ROW_MAJOR
        kv_layout = sm90_utils.make_smem_layout_a(
            row_major, (TILE, self.rows, D_QK), dt, self.stages
        )
        vt_layout = sm90_utils.make_smem_layout_a(
            utils.LayoutEnum.COL_MAJOR, (D_LATENT, self.rows, TILE), dt, 1
        )
        q_layout = sm90_utils.make_smem_layout_b(row_major, (TILE, self.rows, D_QK), dt, 1)
        p_layout = sm90_utils.make_smem_layout_b(row_major, (TILE, self.rows, TILE), dt, 1)
        return mma_s, mma_o, kv_layout, vt_layout, q_layout, p_layout

    @cute.jit
    def _consumer_smem(self, storage, kv_layout, q_layout, p_layout):
        """Views of what the consumer reads and writes in shared memory: the KV ring, the
        query block and its barrier, ``p^T``, and the softmax exchange arrays."""
        s_kv = storage.s_kv.get_tensor(kv_layout.outer, swizzle=kv_layout.inner)
        s_q = storage.s_q.get_tensor(q_layout.outer, swizzle=q_layout.inner)
        s_p = storage.s_p.get_tensor(p_layout.outer, swizzle=p_layout.inner)
        q_bar = storage.q_bar.data_ptr()
        red = storage.red.get_tensor(cute.make_layout((self.rows_per_wg, 4, self.wgs, 2)))
        s_alpha = storage.alpha.get_tensor(cute.make_layout(self.rows))
        s_max = storage.row_max.get_tensor(cute.make_layout(self.rows))
        s_sum = storage.row_sum.get_tensor(cute.make_layout(self.rows))
        return s_kv, s_q, s_p, q_bar, red, s_alpha, s_max, s_sum

    # -- device side --------------------------------------------------------------------------

    @cute.kernel
    def kernel(
        self,
        mma_s: cute.TiledMma,
        mma_o: cute.TiledMma,
        tma_kv_atom: cute.CopyAtom,
        tma_kv: cute.Tensor,
        tma_q_atom: cute.CopyAtom,
        tma_q: cute.Tensor,
        kv_layout: cute.ComposedLayout,
        vt_layout: cute.ComposedLayout,
        q_layout: cute.ComposedLayout,
        p_layout: cute.ComposedLayout,
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
        row0 = rb * self.rows  # first row of this block inside the request
        seq_len, start, end, n_tiles = self._split_tiles(m_seq, b, split, num_splits)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        s_kv, s_q, s_p, q_bar, red, s_alpha, s_max, s_sum = self._consumer_smem(
            storage, kv_layout, q_layout, p_layout
        )

        kv_pipe = self._make_ring(storage, 4 * self.wgs, warp, q_bar)
        s_stage = storage.s_q.data_ptr()  # the output's staging, once the query is spent

        if warp >= self.producer_warp:
            if cutlass.const_expr(self.producer_threads > 32):
                cute.arch.warpgroup_reg_dealloc(40)
            if warp == self.producer_warp:
                self._produce(
                    tma_kv_atom, tma_kv, tma_q_atom, tma_q, s_kv, s_q, q_bar, kv_pipe, m_bt,
                    b, rows_per_req, row0, start, end, n_tiles, page_size,
                )  # fmt: skip
        else:
            if cutlass.const_expr(self.producer_threads > 32):
                cute.arch.warpgroup_reg_alloc(232)
            self._consume(
                mma_s, mma_o, s_kv, s_q, s_p, vt_layout, q_bar, kv_pipe, red, s_alpha, s_max,
                s_sum, m_out, m_lse, m_part_o, m_part_lse, scale_log2, q_len, num_heads,
                num_splits, b, split, rows_per_req, row0, start, end, seq_len, n_tiles, tidx,
                warp, lane, s_stage,
            )  # fmt: skip

    @cute.jit
    def _scores(self, mma_s, acc, r_sa, r_sb, stage):
        """Issue ``s^T = kv @ q^T`` over the 576 dims into ``acc`` (committed, not waited)."""
        mma_s.set(warpgroup.Field.ACCUMULATE, False)
        warpgroup.fence()
        for k in cutlass.range_constexpr(cute.size(r_sa, mode=[2])):
            cute.gemm(mma_s, acc, r_sa[None, None, k, stage], r_sb[None, None, k], acc)
            mma_s.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.commit_group()

    @cute.jit
    def _consume(
        self, mma_s, mma_o, s_kv, s_q, s_p, vt_layout, q_bar, kv_pipe, red, s_alpha, s_max,
        s_sum, m_out, m_lse, m_part_o, m_part_lse, scale_log2, q_len, num_heads, num_splits,
        b, split, rows_per_req, row0, start, end, seq_len, n_tiles, tidx, warp, lane, s_stage,
    ):  # fmt: skip
        """The consumer warp groups: both products and the online softmax, then the output.

        ``s_stage``: the query block's shared memory, where the final rows are gathered
        (``_write_rows``).
        """
        c = self._consumer_setup(
            mma_s, mma_o, s_kv, s_p, vt_layout, red, s_alpha, s_max, s_sum, scale_log2, q_len,
            num_heads, tidx, warp, lane,
        )  # fmt: skip
        wg = warp // 4
        s_q_wg = cute.local_tile(s_q[None, None, 0], (self.rows_per_wg, D_QK), (wg, 0))
        r_sb = c.mma_s.make_fragment_B(c.thr_s.partition_B(s_q_wg))  # (MMA, 1, 36)
        acc_o, m_i, l_i = self._fresh_rows(c)
        cute.arch.mbarrier_wait(q_bar, 0)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        state = self._consume_tiles(
            c, kv_pipe, state, r_sb, acc_o, m_i, l_i, row0, start, end, seq_len, n_tiles
        )
        self._row_totals(c, m_i, l_i)
        base_row = b * rows_per_req + row0
        if cutlass.const_expr(self.split):
            self._write_rows(c, acc_o, m_part_o, m_part_lse, base_row, num_splits, split,
                             rows_per_req, row0, False)  # fmt: skip
        else:
            self._write_rows(c, acc_o, m_out, m_lse, base_row, 1, 0, rows_per_req, row0, True,
                             s_stage)  # fmt: skip

    @cute.jit
    def _consumer_setup(
        self, mma_s, mma_o, s_kv, s_p, vt_layout, red, s_alpha, s_max, s_sum, scale_log2,
        q_len, num_heads, tidx, warp, lane,
    ):  # fmt: skip
        """What the consumer's tile loop and epilogue only read, bundled at trace time: the
        thread's slices of both products, its coordinates, and the shared-memory views.
        (What they write, the accumulators and the softmax state, is passed by name: a loop
        region carries only the variables it names.)"""
        wg = warp // 4
        wg_tidx = tidx % 128
        rpw = self.rows_per_wg
        c = SimpleNamespace(
            mma_s=mma_s, mma_o=mma_o, s_kv=s_kv, vt_layout=vt_layout, red=red, s_alpha=s_alpha,
            s_max=s_max, s_sum=s_sum, scale_log2=scale_log2, q_len=q_len, num_heads=num_heads,
            tidx=tidx, wg=wg, warp_in_wg=warp % 4, lane=lane,
        )  # fmt: skip
        # -- first product: s^T (this warp group's rows) ----------------------------------------
        c.thr_s = mma_s.get_slice(wg_tidx)
        c.r_sa = mma_s.make_fragment_A(c.thr_s.partition_A(s_kv))  # (MMA, 1, 36, stages)
        c.acc_s = cute.make_rmem_tensor(mma_s.partition_shape_C((TILE, rpw)), Float32)
        c.coords_s = c.thr_s.partition_C(cute.make_identity_tensor((TILE, rpw)))
        # p^T is written where the accumulator of s^T sits: view s_p as (token, row).
        s_p_tr = cute.make_tensor(s_p.iterator, cute.select(s_p.layout, mode=[1, 0, 2]))
        c.t_sp = c.thr_s.partition_C(cute.local_tile(s_p_tr[None, None, 0], (TILE, rpw), (0, wg)))
        c.r_p = cute.make_rmem_tensor_like(c.acc_s, BFloat16)
        # -- second product: o^T (this warp group's 512 / wgs dims, all rows) -------------------
        c.thr_o = mma_o.get_slice(wg_tidx)
        c.r_ob = mma_o.make_fragment_B(c.thr_o.partition_B(s_p[None, None, 0]))  # (MMA, 1, 4)
        c.coords_o = c.thr_o.partition_C(cute.make_identity_tensor((self.dims_per_wg, self.rows)))
        return c

    @cute.jit
    def _fresh_rows(self, c):
        """A zero output accumulator and an empty softmax state (running max, denominators)."""
        acc_o = cute.make_rmem_tensor(
            c.mma_o.partition_shape_C((self.dims_per_wg, self.rows)), Float32
        )
        slots = self.rows_per_wg // 4  # distinct rows (accumulator columns) one thread holds
        m_i = cute.make_rmem_tensor((slots,), Float32)
        l_i = cute.make_rmem_tensor((slots,), Float32)
        self._reset_rows(acc_o, m_i, l_i)
        return acc_o, m_i, l_i

    @cute.jit
    def _reset_rows(self, acc_o, m_i, l_i):
        """Zero the output accumulator and empty the softmax state, for a new row block."""
        acc_o.fill(0.0)
        m_i.fill(_NEG_INF)
        l_i.fill(0.0)

    @cute.jit
    def _consume_tiles(
        self, c, kv_pipe, state, r_sb, acc_o, m_i, l_i, row0, start, end, seq_len, n_tiles
    ):
        """Both products and the online softmax over ``n_tiles`` tiles from ``start``, into
        ``acc_o`` / ``m_i`` / ``l_i``; ``r_sb`` is the query block's B fragment. Returns the
        ring's state after the last tile."""
        mma_s, mma_o, acc_s = c.mma_s, c.mma_o, c.acc_s
        wg, warp_in_wg, lane = c.wg, c.warp_in_wg, c.lane
        red, s_alpha = c.red, c.s_alpha
        rpw = self.rows_per_wg
        slots = rpw // 4
        first_t = seq_len - c.q_len  # kv position of query token 0
        for tile in cutlass.range(n_tiles, unroll=1):
            # Both products of a tile run back to back: issuing the next tile's scores early
            # would need a third 72 KiB stage to keep a load in flight, and it does not fit.
            kv_pipe.consumer_wait(state)
            stage = state.index
            if cutlass.const_expr(self.ablation not in ("no_scores", "no_mma")):
                self._scores(mma_s, acc_s, c.r_sa, r_sb, stage)
                warpgroup.wait_group(0)
            else:
                acc_s.fill(0.0)
            tile_start = start + tile * TILE
            # scale, mask (tokens past the split's end, causal query block), column max
            for i in cutlass.range_constexpr(cute.size(acc_s)):
                acc_s[i] = acc_s[i] * c.scale_log2
            # one branch per tile (most tiles need no mask), not one per score
            if tile_start + TILE > cutlass.min(end, first_t + 1):
                for i in cutlass.range_constexpr(cute.size(acc_s)):
                    m, n = c.coords_s[i]
                    row = row0 + wg * rpw + n
                    pos = tile_start + m
                    if pos >= end or pos > first_t + row // c.num_heads:
                        acc_s[i] = Float32(_NEG_INF)
            alpha, m_use = running_max(acc_s, m_i, l_i, red, rpw, warp_in_wg, wg,
                                       lane, tile % 2)  # fmt: skip
            # p^T = exp2(s^T - max) in bf16, row sums per thread
            for i in cutlass.range_constexpr(cute.size(acc_s)):
                j = accumulator_slot(i, rpw)
                p = Float32(cute.math.exp2(acc_s[i] - m_use[j], fastmath=True))
                l_i[j] = l_i[j] + p
                c.r_p[i] = p.to(BFloat16)
            if cutlass.const_expr(self.wgs > 1):  # the other group may still read p^T / alpha
                cute.arch.barrier(barrier_id=3, number_of_threads=self.consumer_threads)
            cute.autovec_copy(c.r_p, c.t_sp)
            if cutlass.const_expr(self.wgs > 1):
                if warp_in_wg == 0 and lane < 4:
                    for j in cutlass.range_constexpr(slots):
                        s_alpha[wg * rpw + accumulator_column(j, lane)] = alpha[j]
            cute.arch.fence_proxy(
                cute.arch.ProxyKind.async_shared, space=cute.arch.SharedSpace.shared_cta
            )
            cute.arch.barrier(barrier_id=3, number_of_threads=self.consumer_threads)

            # o^T = o^T * alpha + kv_c^T @ p^T
            alpha_o = alpha  # one group: o^T's columns are s^T's, so its own alphas
            if cutlass.const_expr(self.wgs > 1):  # two: each holds half the rows' alphas
                alpha_o = cute.make_rmem_tensor((self.rows // 4,), Float32)
                for j in cutlass.range_constexpr(self.rows // 4):
                    alpha_o[j] = s_alpha[accumulator_column(j, lane % 4)]
            for i in cutlass.range_constexpr(cute.size(acc_o)):
                acc_o[i] = acc_o[i] * alpha_o[accumulator_slot(i, self.rows)]
            vt = cute.make_tensor(c.s_kv[None, None, stage].iterator, c.vt_layout.outer)
            vt_wg = cute.local_tile(vt[None, None, 0], (self.dims_per_wg, TILE), (wg, 0))
            r_oa = mma_o.make_fragment_A(c.thr_o.partition_A(vt_wg))
            if cutlass.const_expr(self.ablation not in ("no_values", "no_mma")):
                warpgroup.fence()
                mma_o.set(warpgroup.Field.ACCUMULATE, True)
                for k in cutlass.range_constexpr(cute.size(r_oa, mode=[2])):
                    cute.gemm(mma_o, acc_o, r_oa[None, None, k], c.r_ob[None, None, k], acc_o)
                warpgroup.commit_group()
                warpgroup.wait_group(0)
            kv_pipe.consumer_release(state)
            state.advance()
        return state

    @cute.jit
    def _row_totals(self, c, m_i, l_i):
        """Each row's denominator (summed across the warp group) and max into ``s_sum`` /
        ``s_max``, where every consumer thread can read them after the barrier."""
        wg, warp_in_wg, lane, red = c.wg, c.warp_in_wg, c.lane, c.red
        rpw = self.rows_per_wg
        slots = rpw // 4
        for j in cutlass.range_constexpr(slots):
            l_i[j] = column_sum(l_i[j])
        if lane < 4:
            for j in cutlass.range_constexpr(slots):
                n = accumulator_column(j, lane)
                red[n, warp_in_wg, wg, 0] = l_i[j]
        cute.arch.barrier(barrier_id=1 + wg, number_of_threads=128)
        if warp_in_wg == 0 and lane < 4:
            for j in cutlass.range_constexpr(slots):
                n = accumulator_column(j, lane)
                total = red[n, 0, wg, 0] + red[n, 1, wg, 0] + red[n, 2, wg, 0] + red[n, 3, wg, 0]
                c.s_sum[wg * rpw + n] = total
                c.s_max[wg * rpw + n] = m_i[j]
        cute.arch.barrier(barrier_id=3, number_of_threads=self.consumer_threads)

    @cute.jit
    def _write_rows(
        self, c, acc_o, m_o, m_lse_out, first_row, row_step, row_off, rows_per_req, row0,
        final: cutlass.Constexpr, s_stage=None,
    ):  # fmt: skip
        """Normalise the block's rows and store them: ``final``, the bf16 output and the
        natural-log LSE (when asked for) at row ``first_row + n``; otherwise fp32 rows and
        base-2 LSEs at row ``(first_row + n) * row_step + row_off`` (a split's partial).

        The scale of each of the thread's rows is computed once, so the store loop has no
        division and no branch but the row guard (a predicated store). With a division and
        its ``total > 0`` branch per element, the 128 elements' latencies did not overlap:
        at 32 rows this epilogue took about 10 us at the end of every CTA on the H200 (the
        time of five tiles), and the decode gained 5-7 % when it went (docs/mla-experiments.md).

        With ``s_stage`` (shared memory no product reads any more, ``rows x 520`` bf16) the
        final rows are gathered there and stored whole (``store_staged_rows``): a thread's
        fragment holds pairs of rows, not of dims, so straight from it each warp store writes
        16 bytes in each of 4 rows, 2 bytes a thread."""
        slots = self.rows // 4
        inv = cute.make_rmem_tensor((slots,), Float32)
        for j in cutlass.range_constexpr(slots):
            total = c.s_sum[accumulator_column(j, c.lane % 4)]
            inv[j] = Float32(0.0)
            if total > 0.0:
                inv[j] = 1.0 / total
        staging = cutlass.const_expr(final and s_stage is not None)
        if cutlass.const_expr(staging):
            staged = staged_rows(s_stage, self.rows, D_LATENT)
        for i in cutlass.range_constexpr(cute.size(acc_o)):
            d, n = c.coords_o[i]
            value = acc_o[i] * inv[accumulator_slot(i, self.rows)]
            dim = c.wg * self.dims_per_wg + d
            if cutlass.const_expr(staging):
                staged[n, dim] = value.to(BFloat16)
            elif row0 + n < rows_per_req:
                if cutlass.const_expr(final):
                    m_o[first_row + n, dim] = value.to(BFloat16)
                else:
                    m_o[(first_row + n) * row_step + row_off, dim] = value
        if cutlass.const_expr(staging):
            cute.arch.barrier(barrier_id=3, number_of_threads=self.consumer_threads)
            store_staged_rows(staged, m_o, first_row, rows_per_req - row0, c.tidx,
                              self.consumer_threads)  # fmt: skip
        if c.tidx < self.rows:
            n = c.tidx
            if row0 + n < rows_per_req:
                total = c.s_sum[n]
                lse2 = Float32(_NEG_INF)
                if total > 0.0:
                    lse2 = c.s_max[n] + cute.math.log2(total)
                if cutlass.const_expr(not final):
                    m_lse_out[(first_row + n) * row_step + row_off] = lse2
                elif cutlass.const_expr(self.write_lse):
                    m_lse_out[first_row + n] = lse2 * math.log(2.0)


# -- torch entry point ------------------------------------------------------------------------

_COMPILED: dict[tuple, Any] = {}


_UNUSED: dict[Any, tuple[Any, Any]] = {}


def _unused_partials(device: Any) -> tuple[Any, Any]:
    import torch

    if device not in _UNUSED:
        _UNUSED[device] = (
            torch.empty(1, D_LATENT, dtype=torch.float32, device=device),
            torch.empty(1, dtype=torch.float32, device=device),
        )
    return _UNUSED[device]


def decode_kernel(spec: dict[str, Any]) -> Any:
    """The kernel object a launch spec names (built, not compiled); the spec's fields are the
    plan's that shape the compiled code (``_kernel_spec``)."""
    if spec["fp8"] and spec["rows"] == 64:
        from .cute_decode_fp8_regs64 import MlaDecodeFp8Regs64Sm90

        kernel: Any = MlaDecodeFp8Regs64Sm90(
            spec["page_block"], spec["fp8_stages"], spec["split"], spec["write_lse"],
            spec["per_token"], spec["ablation"], spec["max_slack"],
        )  # fmt: skip
    elif spec["fp8"]:
        from .cute_decode_fp8_regs import MlaDecodeFp8RegsSm90

        kernel = MlaDecodeFp8RegsSm90(
            spec["rows"], spec["page_block"], spec["fp8_stages"], spec["split"],
            spec["write_lse"], spec["per_token"], spec["ablation"], spec["max_slack"],
        )  # fmt: skip
    elif spec["layout"] == "pairs":
        from .cute_seesaw_pairs import MlaDecodeSeesawPairsSm90

        kernel = MlaDecodeSeesawPairsSm90(
            spec["page_block"], spec["split"], spec["write_lse"], spec["evict_first"],
            spec["ablation"], spec["tile"], spec["lazy_rescale"], spec["rope_early"],
        )  # fmt: skip
    else:
        kernel = MlaDecodeSm90(
            spec["rows"], spec["wgs"], spec["page_block"], spec["stages"], spec["split"],
            spec["write_lse"], spec["ablation"], spec["evict_first"],
        )  # fmt: skip
    kernel.page_prefetch = spec["page_prefetch"]
    return kernel


def _kernel_spec(
    plan: dict[str, Any], fp8: bool, per_token: bool, split: bool, write_lse: bool, ablation: str
) -> dict[str, Any]:
    """What of a launch shapes the compiled kernel, by name (a new plan field that does is
    added here once, and both the cache key and ``decode_kernel`` see it)."""
    return {
        "fp8": fp8, "per_token": per_token, "split": split, "write_lse": write_lse,
        "ablation": ablation, "layout": plan["layout"], "rows": plan["rows"], "wgs": plan["wgs"],
        "page_block": plan["page_block"], "stages": plan["stages"],
        "fp8_stages": plan["fp8_stages"], "evict_first": bool(plan["evict_first"]),
        "page_prefetch": bool(plan["page_prefetch"]), "tile": plan["tile"],
        "lazy_rescale": bool(plan["lazy_rescale"]), "rope_early": bool(plan["rope_early"]),
        "max_slack": plan["max_slack"],
    }  # fmt: skip


def _compiled(spec: dict[str, Any], args: tuple) -> Any:
    key = tuple(spec.values())  # the fields are always listed in one order
    fn = _COMPILED.get(key)
    if fn is None:
        fn = _COMPILED[key] = cute.compile(decode_kernel(spec), *args)
    return fn


def mla_decode(
    query: Any,
    kv_cache: Any,
    block_tables: Any,
    seq_lens: Any,
    softmax_scale: float,
    *,
    out: Any = None,
    return_lse: bool = False,
    kv_scale: Any = None,
    workspace: Any = None,
    num_splits: int | None = None,
    fold_sq_factor: int | None = None,
    kv_lora_rank: int = D_LATENT,
    max_seq_len: int | None = None,
    config: dict[str, int] | None = None,
) -> Any:
    """CuTe DSL SM90 MLA decode; the contract is ``tokenspeed.mla.mla_decode``'s.

    A bf16 query over a bf16 cache (up to 32 rows, query tokens x heads, on the tokens
    layout, more in blocks of 64 on the pairs kernel), or over an FP8 (e4m3) cache with
    ``kv_scale`` (one element, or one per token) on the register kernels, in blocks of 16, 32
    or 64 rows.
    ``fold_sq_factor`` is accepted for the common signature: rows of all query tokens are
    already laid out on one axis here, so every fold gives the same launch.
    """
    import torch

    from .triton_decode import _mla_decode_merge_kernel

    fp8 = kv_cache.dtype == torch.float8_e4m3fn
    if kv_lora_rank != D_LATENT or query.shape[-1] != D_QK or query.dtype != torch.bfloat16:
        raise ValueError("the CuTe MLA decode takes a bf16 query over a 576-dim latent cache")
    if fp8 != (kv_scale is not None) or not (fp8 or kv_cache.dtype == torch.bfloat16):
        raise ValueError("the CuTe MLA decode takes a bf16 cache, or an FP8 one with kv_scale")
    batch, q_len, heads, _ = query.shape
    cache = kv_cache.reshape(kv_cache.shape[0], kv_cache.shape[1], D_QK)
    page_size = cache.shape[1]
    if fp8 and kv_scale.numel() not in (1, cache.shape[0] * page_size):
        raise ValueError(f"kv_scale holds {kv_scale.numel()} values: one per tensor, or one "
                         f"scale per token slot ({cache.shape[0] * page_size})")  # fmt: skip
    capacity = block_tables.shape[1] * page_size
    kv_len = min(max_seq_len, capacity) if max_seq_len else capacity
    plan = cute_decode_plan(batch, q_len, heads, kv_len, page_size, num_splits=num_splits,
                            config=config, fp8=fp8)  # fmt: skip
    if out is None:
        out = torch.empty(batch, q_len, heads, D_LATENT, dtype=query.dtype, device=query.device)
    elif not out.is_contiguous():
        raise ValueError("the CuTe MLA decode writes a contiguous out[B, q_len, H, 512]")
    if return_lse:
        lse = torch.empty(batch, q_len, heads, dtype=torch.float32, device=query.device)
    else:  # neither the kernel nor the merge writes it: any fp32 tensor will do
        lse = _unused_partials(query.device)[1]
    if batch == 0:
        return (out, lse) if return_lse else out
    q2d = query.contiguous().view(batch * q_len * heads, D_QK)
    if q2d.shape[0] < plan["rows"]:  # the query TMA box must not be taller than the tensor
        q2d = torch.cat([q2d, q2d.new_zeros(plan["rows"] - q2d.shape[0], D_QK)])
    if fp8:  # the loader copies bytes (token rows, by TMA); the consumers read them as e4m3
        kv_arg = cute_tensor(cache.view(torch.uint8).view(-1, D_QK))
        scale = kv_scale.reshape(-1).to(torch.float32)
        if scale.data_ptr() % 16:  # the loader bulk-copies per-token scales
            scale = scale.clone()
        scale_arg = (cute_tensor(scale, 4),)
    else:
        kv_arg = cute_tensor(cache.view(cache.shape[0] * page_size, D_QK))
        scale_arg = ()
    out2d = out.view(batch * q_len * heads, D_LATENT)
    splits = plan["num_splits"]
    rows_total = batch * q_len * heads
    ablation = str((config or {}).get("ablation", ""))
    if plan["workspace_bytes"]:
        need = plan["workspace_bytes"]
        if workspace is None:
            workspace = torch.empty(need, dtype=torch.uint8, device=query.device)
        elif workspace.numel() * workspace.element_size() < need:
            raise ValueError(f"mla_decode workspace holds {workspace.numel()} bytes, needs {need}")
        floats = workspace.view(torch.uint8)[:need].view(torch.float32)
        part_rows = need // ((D_LATENT + 1) * 4)
        part_o = floats[: part_rows * D_LATENT].view(part_rows, D_LATENT)
        part_lse = floats[part_rows * D_LATENT :]
    else:  # this variant never touches the partials: any fp32 tensors of the right rank
        part_o, part_lse = _unused_partials(query.device)
    stream = torch.cuda.current_stream()
    if fp8:  # the register kernels read the query's pairs of values as words
        q2d = q2d.view(torch.int32)
    args = (
        cute_tensor(q2d), kv_arg, *scale_arg, cute_tensor(block_tables, 4, all_dynamic=True),
        cute_tensor(seq_lens, 4), cute_tensor(out2d), cute_tensor(lse.view(-1), 4),
        cute_tensor(part_o), cute_tensor(part_lse, 4),
        Float32(softmax_scale * math.log2(math.e)), Int32(q_len), Int32(heads), Int32(splits),
        Int32(page_size), Int32(batch), Int32(plan["row_blocks"]),
        cuda.CUstream(stream.cuda_stream),
    )  # fmt: skip
    per_token = fp8 and kv_scale.numel() != 1
    spec = _kernel_spec(plan, fp8, per_token, splits > 1, return_lse, ablation)
    _compiled(spec, args)(*args)
    if splits > 1:
        _mla_decode_merge_kernel[(rows_total,)](
            part_o, part_lse, out, lse, heads, q_len,
            out.stride(0), out.stride(1), out.stride(2),
            DV=D_LATENT, NUM_SPLITS=splits, BLOCK_S=1 << (splits - 1).bit_length(),
            WRITE_LSE=return_lse, num_warps=4,
        )  # fmt: skip
    return (out, lse) if return_lse else out
