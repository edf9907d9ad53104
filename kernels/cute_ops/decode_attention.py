"""Paged GQA decode for Hopper (SM90) in CuTe DSL: TMA page boxes, wgmma, tokens on M.

Why a second decode beside the Triton one: with pages of 16 tokens Triton can only gather a
wide tile through per-thread ``cp.async`` (TMA loads a box per page, and Triton cannot place
several boxes in one shared-memory tile), and at 16 requests x 8 KV heads its one program
per (request, KV head) leaves 4 of 132 SMs idle. Here a producer warp copies each 64-token
tile as ``64 / page_size`` TMA boxes (one per page) into one swizzled tile, and a request's
KV head can be split over a cluster of CTAs (two, at two or three per SM, for small pages)
which merge through global memory at the end: no second launch, no atomics.

One CTA owns the ``group`` query heads of one KV head of one request (padded to 16 rows,
the N of the MMAs) and streams one split of that head's K and V, 64 tokens a tile:

* ``s^T[64 tok, rows] = k[64 tok, D] @ q[rows, D]^T``: both operands K-major in shared memory.
* online softmax down the token axis (per-thread maxima, three butterfly shuffles, a 4-warp
  exchange through shared memory); ``p^T`` goes to shared memory in bf16.
* ``o^T[D, rows] += v^T[D, 64 tok] @ p^T``: the V tile read through its transpose (a K-major
  128-byte-swizzled tile is the MN-major layout of its transpose), so it needs no copy.

*Tile layout.* The swizzle atom is 8 tokens x 64 dims (1 KiB). The usual K-major layout
puts every token's first 64 dims before any token's next 64, so a page block of 128-dim
tokens is two TMA copies; here the atoms go [8-token group][64-dim block], so the block is
one 5-D copy (the cache is viewed as ((token, group), (dim, block, head))). Per-copy cost,
not bytes, limited a CTA on 16-token pages: one CTA per group went from 75-77 % to 91-95 %
of copy bandwidth at 16 x 8k.

*Split merge.* CTAs 1.. of a cluster write their normalised partials and base-2
log-sum-exps to a workspace, every CTA meets at the cluster barrier (arrive has release,
wait acquire semantics), and CTA 0 folds the partials into its own rows in split order and
writes the output.

Needs ``nvidia-cutlass-dsl`` (4.3) and an SM90 GPU; ``tokenspeed.kernels.catalog`` registers
it only when both are present. bf16 query and caches, head dim 64 or 128, group size <= 16.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup

from .common import (
    L2_EVICT_FIRST,
    accumulator_column,
    accumulator_slot,
    column_sum,
    cute_tensor,
    merge_row_max,
)
from .configs import SM90_SMEM_BYTES, gqa_decode_default_config, gqa_decode_smem_bytes

TILE = 64  # KV tokens per tile: the wgmma M of both products
_NEG_INF = -math.inf


class GqaDecodeSm90:
    """One compiled decode variant: padded group rows, head dim, page box, stages, cluster."""

    def __init__(
        self, rows: int, head_dim: int, page_block: int, stages: int, cluster: int,
        evict_first: bool = True, row_groups_first: bool = True,
    ) -> None:  # fmt: skip
        if rows != 16 or head_dim not in (64, 128):
            raise ValueError(f"rows={rows} must be 16 and head_dim={head_dim} 64/128")
        if page_block not in (8, 16, 32, 64) or not 1 <= cluster <= 4 or not 2 <= stages <= 8:
            raise ValueError(f"page_block={page_block}, cluster={cluster}, stages={stages}")
        if gqa_decode_smem_bytes(head_dim, stages, rows) > SM90_SMEM_BYTES:
            raise ValueError(f"{stages} stages of {head_dim}-dim K and V tiles do not fit in "
                             "shared memory")  # fmt: skip
        self.rows = rows
        self.head_dim = head_dim
        self.page_block = page_block
        self.copies_per_tile = TILE // page_block
        self.stages = stages
        self.cluster = cluster
        self.evict_first = evict_first
        # At head dim 64 a token's dims are one swizzle atom already: the layouts coincide.
        self.row_groups_first = row_groups_first and head_dim > 64
        self.consumer_threads = 128
        self.producer_warp = 4
        self.threads = 160

    # -- host side ----------------------------------------------------------------------------

    @cute.jit
    def __call__(
        self,
        m_q: cute.Tensor,  # [batch * q_heads, D] bf16
        m_k: cute.Tensor,  # [pages * page_size, kv_heads * D] bf16
        m_v: cute.Tensor,  # [pages * page_size, kv_heads * D] bf16
        m_bt: cute.Tensor,  # [batch, max_pages] int32
        m_seq: cute.Tensor,  # [batch] int32
        m_out: cute.Tensor,  # [batch * q_heads, D] bf16
        m_part_o: cute.Tensor,  # [batch * kv_heads * (cluster - 1) * rows, D] fp32
        m_part_lse: cute.Tensor,  # [batch * kv_heads * (cluster - 1) * rows] fp32, base 2
        scale_log2: Float32,
        group: Int32,
        num_kv_heads: Int32,
        page_size: Int32,
        batch: Int32,
        stream: cuda.CUstream,
    ):
        mma_s, mma_o, kv_layout, vt_layout, q_layout, p_layout = self._mmas_and_layouts()
        kv_stage = cute.slice_(kv_layout, (None, None, 0))
        box_outer = cute.composition(
            kv_stage.outer, cute.make_layout((self.page_block, self.head_dim), stride=(1, TILE))
        )
        box_layout = cute.make_composed_layout(kv_stage.inner, 0, box_outer)
        box = self._box()
        tma_k_atom, tma_k = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), self._cache_view(m_k), box_layout, box
        )
        tma_v_atom, tma_v = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), self._cache_view(m_v), box_layout, box
        )
        tma_q_atom, tma_q = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), m_q, cute.slice_(q_layout, (None, None, 0)),
            (self.rows, self.head_dim),
        )  # fmt: skip

        @cute.struct
        class SharedStorage:
            kv_full_empty: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            q_bar: cute.struct.MemRange[cutlass.Int64, 1]
            red: cute.struct.MemRange[Float32, 4 * self.rows * 2]
            alpha: cute.struct.MemRange[Float32, self.rows]
            row_max: cute.struct.MemRange[Float32, self.rows]
            row_sum: cute.struct.MemRange[Float32, self.rows]
            s_k: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(kv_layout)], 1024]
            s_v: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(kv_layout)], 1024]
            s_q: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(q_layout)], 1024]
            s_p: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(p_layout)], 1024]

        self.shared_storage = SharedStorage
        launch = {"grid": [self.cluster, num_kv_heads, batch], "block": [self.threads, 1, 1],
                  "stream": stream, "min_blocks_per_mp": 1}  # fmt: skip
        if cutlass.const_expr(self.cluster > 1):
            launch["cluster"] = [self.cluster, 1, 1]
        self.kernel(
            mma_s, mma_o, tma_k_atom, tma_k, tma_v_atom, tma_v, tma_q_atom, tma_q,
            kv_layout, vt_layout, q_layout, p_layout, m_bt, m_seq, m_out, m_part_o, m_part_lse,
            scale_log2, group, page_size,
        ).launch(**launch)  # fmt: skip

    def _box(self):
        """One TMA box: a page block's tokens x one KV head's dims (grouped as the smem tile is)."""
        if cutlass.const_expr(self.row_groups_first):
            return ((8, self.page_block // 8), (64, self.head_dim // 64))
        return (self.page_block, self.head_dim)

    @cute.jit
    def _cache_view(self, m: cute.Tensor):
        """The ``[slots, kv_heads * D]`` cache as ((token, 8-token group), (dim, 64-dim block,
        head)), so that a box's modes line up with the tile's: one TMA copy per page block."""
        if cutlass.const_expr(not self.row_groups_first):
            return m
        width = cute.size(m, mode=[1])
        d = self.head_dim
        layout = cute.make_layout(
            ((8, cute.size(m, mode=[0]) // 8), (64, d // 64, width // d)),
            stride=((width, 8 * width), (1, 64, d)),
        )
        return cute.make_tensor(m.iterator, layout)

    @cute.jit
    def _mmas_and_layouts(self):
        """Both products' tiled MMAs and the shared-memory layouts they read: the K and V
        rings (one layout), the transposed V view, the query block and ``p^T``."""
        mma_s = sm90_utils.make_trivial_tiled_mma(
            BFloat16, BFloat16, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
            Float32, (1, 1, 1), tiler_mn=(TILE, self.rows),
        )  # fmt: skip
        mma_o = sm90_utils.make_trivial_tiled_mma(
            BFloat16, BFloat16, warpgroup.OperandMajorMode.MN, warpgroup.OperandMajorMode.K,
            Float32, (1, 1, 1), tiler_mn=(TILE, self.rows),
        )  # fmt: skip
        row_major = utils.LayoutEnum.ROW_MAJOR
        d = self.head_dim
        kv_layout = sm90_utils.make_smem_layout_a(row_major, (TILE, self.rows, d), BFloat16,
                                                  self.stages)  # fmt: skip
        vt_layout = sm90_utils.make_smem_layout_a(
            utils.LayoutEnum.COL_MAJOR, (d, self.rows, TILE), BFloat16, 1
        )
        if cutlass.const_expr(self.row_groups_first):
            # The same 1 KiB swizzle atoms (8 tokens x 64 dims), but a group of 8 tokens keeps
            # all its dims together: [token group][64-dim block][token][dim]. A page block is
            # then one TMA box (up to 5 dims), not one per 64-dim block.
            blocks = d // 64
            kv_layout = cute.make_composed_layout(
                kv_layout.inner, 0,
                cute.make_layout(((8, TILE // 8), (64, blocks), self.stages),
                                 stride=((64, 8 * d), (1, 512), TILE * d)),
            )  # fmt: skip
            vt_layout = cute.make_composed_layout(
                vt_layout.inner, 0,
                cute.make_layout(((64, blocks), (8, TILE // 8), 1),
                                 stride=((1, 512), (64, 8 * d), 0)),
            )  # fmt: skip
        q_layout = sm90_utils.make_smem_layout_b(row_major, (TILE, self.rows, d), BFloat16, 1)
        p_layout = sm90_utils.make_smem_layout_b(row_major, (TILE, self.rows, TILE), BFloat16, 1)
        return mma_s, mma_o, kv_layout, vt_layout, q_layout, p_layout

    # -- device side --------------------------------------------------------------------------

    @cute.kernel
    def kernel(
        self,
        mma_s: cute.TiledMma,
        mma_o: cute.TiledMma,
        tma_k_atom: cute.CopyAtom,
        tma_k: cute.Tensor,
        tma_v_atom: cute.CopyAtom,
        tma_v: cute.Tensor,
        tma_q_atom: cute.CopyAtom,
        tma_q: cute.Tensor,
        kv_layout: cute.ComposedLayout,
        vt_layout: cute.ComposedLayout,
        q_layout: cute.ComposedLayout,
        p_layout: cute.ComposedLayout,
        m_bt: cute.Tensor,
        m_seq: cute.Tensor,
        m_out: cute.Tensor,
        m_part_o: cute.Tensor,
        m_part_lse: cute.Tensor,
        scale_log2: Float32,
        group: Int32,
        page_size: Int32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        split, kv_head, b = cute.arch.block_idx()
        _, num_kv_heads, _ = cute.arch.grid_dim()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()

        seq_len = m_seq[b]
        per_split = (((seq_len + self.cluster - 1) // self.cluster + TILE - 1) // TILE) * TILE
        start = split * per_split
        end = cutlass.min(start + per_split, seq_len)
        n_tiles = cutlass.max((end - start + TILE - 1) // TILE, 0)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        s_k = storage.s_k.get_tensor(kv_layout.outer, swizzle=kv_layout.inner)
        s_v = storage.s_v.get_tensor(kv_layout.outer, swizzle=kv_layout.inner)
        s_v_rows = storage.s_v.get_tensor(kv_layout.outer)  # unswizzled: whole rows only
        s_q = storage.s_q.get_tensor(q_layout.outer, swizzle=q_layout.inner)
        s_p = storage.s_p.get_tensor(p_layout.outer, swizzle=p_layout.inner)
        q_bar = storage.q_bar.data_ptr()
        red = storage.red.get_tensor(cute.make_layout((self.rows, 4, 2)))
        s_alpha = storage.alpha.get_tensor(cute.make_layout(self.rows))
        s_max = storage.row_max.get_tensor(cute.make_layout(self.rows))
        s_sum = storage.row_sum.get_tensor(cute.make_layout(self.rows))
        kv_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.kv_full_empty.data_ptr(),
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 4),
            tx_count=2 * TILE * self.head_dim * 2,
            defer_sync=True,
        )
        if warp == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_init(q_bar, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        q_row0 = b * num_kv_heads * group + kv_head * group
        if warp == self.producer_warp:
            self._produce(
                tma_k_atom, tma_k, tma_v_atom, tma_v, tma_q_atom, tma_q, s_k, s_v, s_q, q_bar,
                kv_pipe, m_bt, b, kv_head, q_row0, start, end, n_tiles, page_size,
            )  # fmt: skip
            if cutlass.const_expr(self.cluster > 1):
                # Every thread of both CTAs takes part in the one cluster barrier (the
                # consumers' arrival is in _consume, between publishing and reading).
                cute.arch.cluster_arrive()
                cute.arch.cluster_wait()
        elif warp < self.producer_warp:
            self._consume(
                mma_s, mma_o, s_k, s_v, s_v_rows, s_q, s_p, vt_layout, q_bar, kv_pipe, red,
                s_alpha, s_max, s_sum, m_out, m_part_o, m_part_lse, scale_log2, group, b, kv_head,
                split, q_row0, start, end, n_tiles, tidx, warp, lane, num_kv_heads,
            )  # fmt: skip

    @cute.jit
    def _produce(
        self, tma_k_atom, tma_k, tma_v_atom, tma_v, tma_q_atom, tma_q, s_k, s_v, s_q, q_bar,
        kv_pipe, m_bt, b, kv_head, q_row0, start, end, n_tiles, page_size,
    ):  # fmt: skip
        """The producer warp: the query block once, then the K and V boxes of every tile."""
        d = self.head_dim
        g_q = cute.local_tile(cute.domain_offset((q_row0, 0), tma_q), (self.rows, d), (0, 0))
        t_qs, t_qg = cpasync.tma_partition(
            tma_q_atom, 0, cute.make_layout(1), cute.group_modes(s_q, 0, 2),
            cute.group_modes(g_q, 0, 2),
        )  # fmt: skip
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(q_bar, self.rows * d * 2)
        cute.copy(tma_q_atom, t_qg, t_qs[(None, 0)], tma_bar_ptr=q_bar)

        box = self._box()
        hint = {}
        if cutlass.const_expr(self.evict_first):
            hint = {"cache_policy": cutlass.Int64(cutlass.Int64(L2_EVICT_FIRST).ir_value())}
        # (box, copies per tile, stages) views of the rings; (box, box row) views of this KV
        # head's column of the caches.
        t_ks, t_kg = cpasync.tma_partition(
            tma_k_atom, 0, cute.make_layout(1), cute.group_modes(cute.flat_divide(s_k, box), 0, 2),
            cute.group_modes(cute.local_tile(tma_k, box, (None, kv_head)), 0, 2),
        )  # fmt: skip
        t_vs, t_vg = cpasync.tma_partition(
            tma_v_atom, 0, cute.make_layout(1), cute.group_modes(cute.flat_divide(s_v, box), 0, 2),
            cute.group_modes(cute.local_tile(tma_v, box, (None, kv_head)), 0, 2),
        )  # fmt: skip
        n_boxes = cute.size(t_kg, mode=[1])
        # Box rows of the next tile, read from the block table one tile ahead: the reads of a
        # tile are issued together, and wait while the producer waits for a free stage (one
        # dependent block-table read per box made small pages 1.8x slower).
        rows = cute.make_rmem_tensor((self.copies_per_tile,), Int32)
        self._box_rows(rows, m_bt, b, start, end, page_size, n_boxes)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        for tile in cutlass.range(n_tiles, unroll=1):
            now = cute.make_rmem_tensor((self.copies_per_tile,), Int32)
            for c in cutlass.range_constexpr(self.copies_per_tile):
                now[c] = rows[c]
            self._box_rows(rows, m_bt, b, start + (tile + 1) * TILE, end, page_size, n_boxes)
            kv_pipe.producer_acquire(state)
            bar = kv_pipe.producer_get_barrier(state)
            for c in cutlass.range_constexpr(self.copies_per_tile):
                cute.copy(tma_k_atom, t_kg[(None, now[c])], t_ks[(None, c, 0, state.index)],
                          tma_bar_ptr=bar, **hint)  # fmt: skip
                cute.copy(tma_v_atom, t_vg[(None, now[c])], t_vs[(None, c, 0, state.index)],
                          tma_bar_ptr=bar, **hint)  # fmt: skip
            kv_pipe.producer_commit(state)
            state.advance()

    @cute.jit
    def _box_rows(self, rows, m_bt, b, tile_start, end, page_size, n_boxes):
        """The box row of each page block of the tile at ``tile_start``. A block wholly past
        the split's end gets ``n_boxes`` (past the cache: TMA zero-fills it and still counts
        its bytes); its block-table read is clamped to a valid entry, so every read is
        unconditional and they can all be in flight at once."""
        for c in cutlass.range_constexpr(self.copies_per_tile):
            pos = tile_start + c * self.page_block
            page = m_bt[b, cutlass.max(cutlass.min(pos, end - 1), 0) // page_size]
            row = (page * page_size + pos % page_size) // self.page_block
            if pos >= end:
                row = Int32(n_boxes)
            rows[c] = row

    @cute.jit
    def _consume(
        self, mma_s, mma_o, s_k, s_v, s_v_rows, s_q, s_p, vt_layout, q_bar, kv_pipe, red,
        s_alpha, s_max, s_sum, m_out, m_part_o, m_part_lse, scale_log2, group, b, kv_head,
        split, q_row0, start, end, n_tiles, tidx, warp, lane, num_kv_heads,
    ):  # fmt: skip
        """The consumer warp group: both products and the online softmax, then the output."""
        rows = self.rows
        d = self.head_dim
        thr_s = mma_s.get_slice(tidx)
        r_sa = mma_s.make_fragment_A(thr_s.partition_A(s_k))  # (MMA, 1, D/16, stages)
        r_sb = mma_s.make_fragment_B(thr_s.partition_B(s_q[None, None, 0]))  # (MMA, 1, D/16)
        acc_s = cute.make_rmem_tensor(mma_s.partition_shape_C((TILE, rows)), Float32)
        coords_s = thr_s.partition_C(cute.make_identity_tensor((TILE, rows)))
        # p^T is written where the accumulator of s^T sits: view s_p as (token, row).
        s_p_tr = cute.make_tensor(s_p.iterator, cute.select(s_p.layout, mode=[1, 0, 2]))
        t_sp = thr_s.partition_C(s_p_tr[None, None, 0])
        r_p = cute.make_rmem_tensor_like(acc_s, BFloat16)
        thr_o = mma_o.get_slice(tidx)
        r_ob = mma_o.make_fragment_B(thr_o.partition_B(s_p[None, None, 0]))  # (MMA, 1, 4)
        acc_o = cute.make_rmem_tensor(mma_o.partition_shape_C((d, rows)), Float32)
        coords_o = thr_o.partition_C(cute.make_identity_tensor((d, rows)))
        acc_o.fill(0.0)

        slots = rows // 4  # distinct rows (accumulator columns) one thread holds
        m_i = cute.make_rmem_tensor((slots,), Float32)
        l_i = cute.make_rmem_tensor((slots,), Float32)
        m_i.fill(_NEG_INF)
        l_i.fill(0.0)

        cute.arch.mbarrier_wait(q_bar, 0)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        for tile in cutlass.range(n_tiles, unroll=1):
            kv_pipe.consumer_wait(state)
            stage = state.index
            mma_s.set(warpgroup.Field.ACCUMULATE, False)
            warpgroup.fence()
            for k in cutlass.range_constexpr(cute.size(r_sa, mode=[2])):
                cute.gemm(mma_s, acc_s, r_sa[None, None, k, stage], r_sb[None, None, k], acc_s)
                mma_s.set(warpgroup.Field.ACCUMULATE, True)
            warpgroup.commit_group()
            warpgroup.wait_group(0)

            tile_start = start + tile * TILE
            masked = tile_start + TILE > end
            tile_max = cute.make_rmem_tensor((slots,), Float32)
            tile_max.fill(_NEG_INF)
            for i in cutlass.range_constexpr(cute.size(acc_s)):
                m, _n = coords_s[i]
                v = acc_s[i] * scale_log2
                if masked:
                    if tile_start + m >= end:
                        v = Float32(_NEG_INF)
                acc_s[i] = v
                j = accumulator_slot(i, rows)
                tile_max[j] = cute.arch.fmax(tile_max[j], v)
            if masked:
                # Tokens past the end may hold anything (a fresh pool is uninitialised): a
                # zero weight times NaN is NaN, so their V rows become zeros. The swizzle
                # moves 16-byte chunks only within a 128-byte row, so whole rows can be
                # cleared through the unswizzled view.
                for e in cutlass.range(tidx, (TILE - (end - tile_start)) * d, 128):
                    s_v_rows[end - tile_start + e // d, e % d, stage] = BFloat16(0.0)
            alpha, m_use = merge_row_max(tile_max, m_i, l_i, red, (tile % 2,), warp, lane, 1)
            for i in cutlass.range_constexpr(cute.size(acc_s)):
                j = accumulator_slot(i, rows)
                p = Float32(cute.math.exp2(acc_s[i] - m_use[j], fastmath=True))
                l_i[j] = l_i[j] + p
                r_p[i] = p.to(BFloat16)
            cute.autovec_copy(r_p, t_sp)
            if warp == 0 and lane < 4:
                for j in cutlass.range_constexpr(slots):
                    s_alpha[accumulator_column(j, lane)] = alpha[j]
            cute.arch.fence_proxy(
                cute.arch.ProxyKind.async_shared, space=cute.arch.SharedSpace.shared_cta
            )
            cute.arch.barrier(barrier_id=1, number_of_threads=128)

            # o^T = o^T * alpha + v^T @ p^T
            for i in cutlass.range_constexpr(cute.size(acc_o)):
                _d, n = coords_o[i]
                acc_o[i] = acc_o[i] * s_alpha[n]
            vt = cute.make_tensor(s_v[None, None, stage].iterator, vt_layout.outer)
            r_oa = mma_o.make_fragment_A(thr_o.partition_A(vt[None, None, 0]))
            warpgroup.fence()
            mma_o.set(warpgroup.Field.ACCUMULATE, True)
            for k in cutlass.range_constexpr(cute.size(r_oa, mode=[2])):
                cute.gemm(mma_o, acc_o, r_oa[None, None, k], r_ob[None, None, k], acc_o)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            kv_pipe.consumer_release(state)
            state.advance()

        # -- epilogue: row sums across the warp group, then this split's rows ------------------
        for j in cutlass.range_constexpr(slots):
            l_i[j] = column_sum(l_i[j])
        if lane < 4:
            for j in cutlass.range_constexpr(slots):
                red[accumulator_column(j, lane), warp, 0] = l_i[j]
        cute.arch.barrier(barrier_id=1, number_of_threads=128)
        if warp == 0 and lane < 4:
            for j in cutlass.range_constexpr(slots):
                n = accumulator_column(j, lane)
                s_sum[n] = red[n, 0, 0] + red[n, 1, 0] + red[n, 2, 0] + red[n, 3, 0]
                s_max[n] = m_i[j]
        cute.arch.barrier(barrier_id=1, number_of_threads=128)

        # Splits 1.. publish their rows; split 0 folds them in, in split order.
        part_row0 = (b * num_kv_heads + kv_head) * (self.cluster - 1) * rows
        if cutlass.const_expr(self.cluster == 1):
            self._write_rows(acc_o, coords_o, s_sum, m_out, q_row0, group, None, None, None, 0)
        else:
            if split > 0:  # publish this split's normalised rows and their base-2 LSE
                mine = part_row0 + (split - 1) * rows
                for i in cutlass.range_constexpr(cute.size(acc_o)):
                    dim, n = coords_o[i]
                    total = s_sum[n]
                    inv = Float32(0.0)
                    if total > 0.0:
                        inv = 1.0 / total
                    m_part_o[mine + n, dim] = acc_o[i] * inv
                if tidx < rows:
                    total = s_sum[tidx]
                    lse2 = Float32(_NEG_INF)
                    if total > 0.0:
                        lse2 = s_max[tidx] + cute.math.log2(total)
                    m_part_lse[mine + tidx] = lse2
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
            if split == 0:
                self._write_rows(acc_o, coords_o, s_sum, m_out, q_row0, group, s_max, m_part_o,
                                 m_part_lse, part_row0)  # fmt: skip

    @cute.jit
    def _write_rows(self, acc_o, coords_o, s_sum, m_out, q_row0, group, s_max, m_part_o,
                    m_part_lse, part_row0):  # fmt: skip
        """Normalise and write this CTA's ``group`` real rows; with ``s_max`` given, first fold
        in the other splits' partials (their rows from ``part_row0`` of the workspace on)."""
        for i in cutlass.range_constexpr(cute.size(acc_o)):
            dim, n = coords_o[i]
            if n < group:
                total = s_sum[n]
                value = acc_o[i]
                if cutlass.const_expr(s_max is not None):
                    top = s_max[n]
                    for r in cutlass.range_constexpr(self.cluster - 1):
                        row = part_row0 + r * self.rows + n
                        theirs = m_part_lse[row]
                        new_top = cute.arch.fmax(top, theirs)
                        base = new_top
                        if new_top == _NEG_INF:
                            base = Float32(0.0)
                        w_mine = Float32(cute.math.exp2(top - base, fastmath=True))
                        w_theirs = Float32(cute.math.exp2(theirs - base, fastmath=True))
                        value = value * w_mine + m_part_o[row, dim] * w_theirs
                        total = total * w_mine + w_theirs
                        top = new_top
                inv = Float32(0.0)
                if total > 0.0:
                    inv = 1.0 / total
                m_out[q_row0 + n, dim] = (value * inv).to(BFloat16)


# -- torch entry point ------------------------------------------------------------------------

_COMPILED: dict[tuple, Any] = {}
_WORKSPACES: dict[Any, Any] = {}
_RETIRED: list[Any] = []


def _workspace(device: Any, rows: int, head_dim: int) -> tuple[Any, Any]:
    """The cluster merge's partials (each call overwrites what it reads: no clearing).

    Kept per device and grown on demand. A replaced buffer is retired, not freed, because a
    captured CUDA graph may still point at it; and one made while a graph is being captured
    belongs to the graph's memory pool, so it is not cached for later calls.
    """
    import torch

    key = (device, head_dim)
    have = _WORKSPACES.get(key)
    if have is not None and have[0].shape[0] >= rows:
        return have
    fresh = (torch.empty(rows, head_dim, dtype=torch.float32, device=device),
             torch.empty(rows, dtype=torch.float32, device=device))  # fmt: skip
    capturing = torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing()
    if not capturing:
        if have is not None:
            _RETIRED.append(have)
        _WORKSPACES[key] = fresh
    return fresh


def paged_decode_attention(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    block_tables: Any,
    seq_lens: Any,
    scale: float,
    *,
    config: Mapping[str, Any] | None = None,
) -> Any:
    """CuTe DSL SM90 paged GQA decode; see ``tokenspeed.kernels.paged_decode_attention``."""
    import torch

    batch, q_heads, head_dim = q.shape
    pages, page_size, kv_heads, _ = k_cache.shape
    group = q_heads // kv_heads
    if (q.dtype != torch.bfloat16 or k_cache.dtype != torch.bfloat16
            or v_cache.dtype != torch.bfloat16):  # fmt: skip
        raise ValueError("the CuTe GQA decode takes a bf16 query and bf16 caches")
    if head_dim not in (64, 128) or v_cache.shape[-1] != head_dim or group > 16:
        raise ValueError(f"the CuTe GQA decode needs head dim 64/128 for q, K and V and at most "
                         f"16 query heads per KV head (got {head_dim}, group {group})")  # fmt: skip
    if not (page_size in (8, 16, 32) or page_size % 64 == 0):
        raise ValueError(f"page_size {page_size}: the CuTe GQA decode needs 8/16/32 or a "
                         "multiple of 64")  # fmt: skip
    for cache in (k_cache, v_cache):
        if not cache.is_contiguous():
            raise ValueError(
                "the CuTe GQA decode reads contiguous [pages, page, heads, dim] caches"
            )
    cfg = dict(config or {})
    if "cluster" not in cfg:
        traits = {"batch": batch, "num_kv_heads": kv_heads, "page_size": page_size}
        cfg = {**gqa_decode_default_config(traits), **cfg}
    cluster, stages = int(cfg["cluster"]), int(cfg.get("stages", 3))
    rows = 16  # the N of both products (CuTe DSL 4.3 rejects an n8 accumulator's layout)
    out = torch.empty(batch, q_heads, head_dim, dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    q2d = q.contiguous().view(batch * q_heads, head_dim)
    if q2d.shape[0] < rows:  # the query TMA box must not be taller than the tensor
        q2d = torch.cat([q2d, q2d.new_zeros(rows - q2d.shape[0], head_dim)])
    part_o, part_lse = _workspace(q.device, max(batch * kv_heads * (cluster - 1) * rows, 1),
                                  head_dim)  # fmt: skip
    slots = pages * page_size
    args = (
        cute_tensor(q2d), cute_tensor(k_cache.view(slots, kv_heads * head_dim)),
        cute_tensor(v_cache.view(slots, kv_heads * head_dim)),
        cute_tensor(block_tables, 4, all_dynamic=True), cute_tensor(seq_lens, 4),
        cute_tensor(out.view(batch * q_heads, head_dim)), cute_tensor(part_o),
        cute_tensor(part_lse, 4), Float32(scale * math.log2(math.e)), Int32(group),
        Int32(kv_heads), Int32(page_size), Int32(batch),
        cuda.CUstream(torch.cuda.current_stream().cuda_stream),
    )  # fmt: skip
    variant = (rows, head_dim, min(page_size, TILE), stages, cluster,
               bool(cfg.get("evict_first", 1)), bool(cfg.get("box", 1)))  # fmt: skip
    key = (*variant, kv_heads)  # the caches' row width is a compile-time extent
    fn = _COMPILED.get(key)
    if fn is None:
        fn = _COMPILED[key] = cute.compile(GqaDecodeSm90(*variant), *args)
    fn(*args)
    return out
