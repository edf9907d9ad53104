"""Absorbed-MLA decode for Hopper (SM90) in CuTe DSL: 64 query rows on the MMA M axis, two
consumer warp groups that take turns on the softmax ("seesaw").

Where ``cute_decode.MlaDecodeSm90`` puts the KV tokens on M (so 16 heads need no padding), this
kernel is for 64+ rows per request, where the tensor cores matter. One CTA owns 64 rows
(query token x head pairs) of one request and streams one KV split, 64 tokens a tile:

* ``S[64 rows, 64 tok] = Q[64, 576] @ K^T``: both operands K-major in shared memory; one
  ``m64n64k16`` chain reads 4 KiB of shared memory per 131 kFLOP (the KV-on-M layout reads
  6 KiB: it is shared-memory bound there, not here).
* the row statistics live in the threads that hold the row: a row max is a quad shuffle,
  with no cross-warp exchange.
* ``O[64, 512] += P[64, 64 tok] @ V[64 tok, 512]``: the 512 output dims are split over the two
  warp groups (a ``64 x 256`` fp32 accumulator each, 128 registers); V is the first 512 dims of
  the same tile, read as the MN-major B operand (the 128-byte-swizzled K-major tile *is* that
  layout), so it costs no second load.

**Seesaw.** Tile ``t``'s scores and softmax are computed by warp group ``t % 2`` (its owner):
it publishes ``P_t`` (bf16, shared memory), the new running max ``M_t`` and the rescale factor
``alpha_t = exp2(M_{t-1} - M_t)``, then both groups rescale their half of ``O`` and add
``P_t @ V_t``. While one group runs its softmax, the other group's products keep the tensor
cores busy. Named barriers order the hand-over: ``PUB`` (owner arrives once ``P_t`` is
written; the other group waits before reading it) and ``FREE`` (the previous owner arrives once
its product with ``P_{t-1}`` is done, so ``P_t`` may overwrite it), one barrier per direction.
Each group sums the softmax denominators of its own tiles under the shared rescaling; the
halves are added at the end.

A producer warp (its warp group gives its registers to the consumers) reads the block table
and issues the TMA loads into a 2-stage ring of 72 KiB tiles; a stage is released when both
groups are done with the tile. Query block (72 KiB), ring (144 KiB) and ``P`` (8 KiB) fill
the SM's shared memory: one CTA per SM. That ring is what limits it (docs/mla.md): with two
tiles, the loads cannot run ahead of the tensor cores, so their times add.

Needs ``nvidia-cutlass-dsl`` (4.3) and an SM90 GPU; bf16 query and cache. The launch wrapper is
``cute_decode.mla_decode`` (the plan picks this kernel for 64+ rows per request).
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float32, Int32
from cutlass.cute.nvgpu import warpgroup

from tokenspeed.kernels.cute_ops.common import staged_rows, store_staged_rows, vector_at

from .cute_decode import TILE, KvRingProducer

ROWS = 64  # query rows per CTA: the wgmma M
D_LATENT = 512
D_ROPE = 64
D_QK = D_LATENT + D_ROPE
HALF_V = D_LATENT // 2  # output dims per consumer warp group
_NEG_INF = -math.inf

# Named barriers (0 is __syncthreads). A hardware barrier completes on a thread count, not on
# who arrived: if one group both arrived and then waited on the same barrier, its own two
# halves could complete it. So every signal has one barrier per direction, indexed by the
# parity of the tile it is about (tile t is owned by group t % 2): always arrived by the same
# group and waited on by the other.
_BAR_PUB = 1  # + parity of t: group t % 2 published P_t, M_t and alpha_t
_BAR_FREE = 3  # + parity of t: group t % 2's product with P_t is done; P may be overwritten
_BAR_CONSUMERS = 5  # both consumer warp groups (epilogue)
_PAIR = 256  # threads of the two consumer warp groups


class TwoGroupRows:
    """The epilogue both 64-row kernels share: two consumer warp groups, each holding half of
    ``O``'s 512 dims for the same 64 rows and the denominators of the tiles it exponentiated.

    A kernel sets ``split`` (write fp32 partials and base-2 LSEs for the merge) and
    ``write_lse``.
    """

    @cute.jit
    def _finish_rows(
        self, acc_o, coords_o, l_own, m_run, s_sum, my_rows, wg, lane, b, split, rows_per_req,
        row0, num_splits, m_out, m_lse, m_part_o, m_part_lse, s_stage, out_scale=None,
    ):  # fmt: skip
        """Add the two groups' denominators, normalise this group's half of ``O`` and write
        it (and, from group 0, the rows' LSE); rows past the request are not written.
        ``out_scale``: a factor of every output value (an FP8 cache's scale per tensor).

        ``s_stage`` is shared memory no product reads any more (the query block), at least
        ``64 x 520`` bf16: the final rows are gathered there and stored whole
        (``store_staged_rows``)."""
        for h in cutlass.range_constexpr(2):
            x = l_own[h]
            x = x + cute.arch.shuffle_sync_bfly(x, offset=1)
            x = x + cute.arch.shuffle_sync_bfly(x, offset=2)
            l_own[h] = x
        if lane % 4 == 0:
            for h in cutlass.range_constexpr(2):
                s_sum[my_rows[h], wg] = l_own[h]
        cute.arch.barrier(barrier_id=_BAR_CONSUMERS, number_of_threads=_PAIR)
        inv = cute.make_rmem_tensor((2,), Float32)
        for h in cutlass.range_constexpr(2):
            total = s_sum[my_rows[h], 0] + s_sum[my_rows[h], 1]
            l_own[h] = total
            inv[h] = Float32(0.0)
            if total > 0.0:
                if cutlass.const_expr(out_scale is None):
                    inv[h] = 1.0 / total
                else:
                    inv[h] = out_scale / total

        # Elements i and i + 1 are adjacent dims of one row: moved together (4 bytes bf16, 8
        # fp32), scaled and converted outside any branch.
        base_row = b * rows_per_req + row0
        dtype = Float32 if cutlass.const_expr(self.split) else BFloat16
        pair = cute.make_rmem_tensor((2,), dtype)
        staged = staged_rows(s_stage, ROWS, D_LATENT)
        for i in cutlass.range_constexpr(0, cute.size(acc_o), 2):
            n, d = coords_o[i]
            scale = inv[(i // 2) % 2]
            pair[0] = (acc_o[i] * scale).to(dtype)
            pair[1] = (acc_o[i + 1] * scale).to(dtype)
            dim = wg * HALF_V + d
            if cutlass.const_expr(self.split):
                dst = vector_at(m_part_o, ((base_row + n) * num_splits + split, dim), 2)
                if row0 + n < rows_per_req:
                    cute.autovec_copy(pair, dst)
            else:
                cute.autovec_copy(pair, vector_at(staged, (n, dim), 2))
        if cutlass.const_expr(not self.split):
            cute.arch.barrier(barrier_id=_BAR_CONSUMERS, number_of_threads=_PAIR)
            tidx, _, _ = cute.arch.thread_idx()  # the consumers are threads 0-255
            store_staged_rows(staged, m_out, base_row, rows_per_req - row0, tidx, _PAIR)
        if wg == 0 and lane % 4 == 0:
            for h in cutlass.range_constexpr(2):
                n = my_rows[h]
                if row0 + n < rows_per_req:
                    lse2 = Float32(_NEG_INF)
                    if l_own[h] > 0.0:
                        lse2 = m_run[h] + cute.math.log2(l_own[h])
                    if cutlass.const_expr(self.split):
                        m_part_lse[(base_row + n) * num_splits + split] = lse2
                    elif cutlass.const_expr(self.write_lse):
                        m_lse[base_row + n] = lse2 * math.log(2.0)


class MlaDecodeSeesawSm90(KvRingProducer, TwoGroupRows):
    """One compiled variant: page copy size, split output or not, LSE or not."""

    def __init__(
        self, page_block: int, split: bool, write_lse: bool, ablation: str = "",
        evict_first: bool = False,
    ) -> None:  # fmt: skip
        if page_block not in (8, 16, 32, 64):
            raise ValueError(f"page_block={page_block} must be 8, 16, 32 or 64")
        self.rows = ROWS
        self.stages = 2  # two 72 KiB tiles: with the 72 KiB query block, all that fits
        self.page_block = page_block
        self.copies_per_tile = TILE // page_block
        self.split = split
        self.write_lse = write_lse
        # Benchmark-only: leave a product out ("no_scores", "no_values") or both ("no_mma") to
        # place the time of a tile, or load every tile from L2 ("l2_loads", see
        # ``MlaDecodeSm90``); the results are then wrong.
        if ablation not in ("", "no_scores", "no_values", "no_mma", "l2_loads"):
            raise ValueError(f"unknown ablation {ablation!r}")
        self.ablation = ablation
        self.evict_first = evict_first
        self.producer_warp = 8
        self.threads = 3 * 128  # two consumer warp groups + the producer's warp group

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
        k_major = warpgroup.OperandMajorMode.K
        mma_s = sm90_utils.make_trivial_tiled_mma(
            BFloat16, BFloat16, k_major, k_major, Float32, (1, 1, 1), tiler_mn=(ROWS, TILE)
        )
        mma_o = sm90_utils.make_trivial_tiled_mma(
            BFloat16, BFloat16, k_major, warpgroup.OperandMajorMode.MN, Float32, (1, 1, 1),
            tiler_mn=(ROWS, HALF_V),
        )  # fmt: skip
        row_major = utils.LayoutEnum.ROW_MAJOR
        q_layout = sm90_utils.make_smem_layout_a(row_major, (ROWS, TILE, D_QK), BFloat16, 1)
        kv_layout = sm90_utils.make_smem_layout_b(
            row_major, (ROWS, TILE, D_QK), BFloat16, self.stages
        )
        # V = the first 512 dims of a KV stage, as an N-major (dims contiguous) B operand.
        v_layout = sm90_utils.make_smem_layout_b(
            utils.LayoutEnum.COL_MAJOR, (ROWS, D_LATENT, TILE), BFloat16, 1
        )
        p_layout = sm90_utils.make_smem_layout_a(row_major, (ROWS, HALF_V, TILE), BFloat16, 1)
        tma_kv_atom, tma_kv, tma_q_atom, tma_q = self._make_tmas(m_q, m_kv, q_layout, kv_layout)

        @cute.struct
        class SharedStorage:
            kv_full_empty: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            q_bar: cute.struct.MemRange[cutlass.Int64, 1]
            row_max: cute.struct.MemRange[Float32, 2 * ROWS]  # published M, by tile parity
            alpha: cute.struct.MemRange[Float32, 2 * ROWS]  # published alpha, by tile parity
            row_sum: cute.struct.MemRange[Float32, 2 * ROWS]  # per-group denominators (end)
            s_kv: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(kv_layout)], 1024]
            s_q: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(q_layout)], 1024]
            s_p: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(p_layout)], 1024]

        self.shared_storage = SharedStorage
        self.kernel(
            mma_s, mma_o, tma_kv_atom, tma_kv, tma_q_atom, tma_q,
            kv_layout, v_layout, q_layout, p_layout,
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
        tma_kv_atom: cute.CopyAtom,
        tma_kv: cute.Tensor,
        tma_q_atom: cute.CopyAtom,
        tma_q: cute.Tensor,
        kv_layout: cute.ComposedLayout,
        v_layout: cute.ComposedLayout,
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

        rows_per_req = q_len * num_heads
        row0 = rb * ROWS  # first row of this block inside the request
        seq_len, start, end, n_tiles = self._split_tiles(m_seq, b, split, num_splits)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        s_kv = storage.s_kv.get_tensor(kv_layout.outer, swizzle=kv_layout.inner)
        s_q = storage.s_q.get_tensor(q_layout.outer, swizzle=q_layout.inner)
        s_p = storage.s_p.get_tensor(p_layout.outer, swizzle=p_layout.inner)
        q_bar = storage.q_bar.data_ptr()
        s_max = storage.row_max.get_tensor(cute.make_layout((ROWS, 2)))
        s_alpha = storage.alpha.get_tensor(cute.make_layout((ROWS, 2)))
        s_sum = storage.row_sum.get_tensor(cute.make_layout((ROWS, 2)))

        kv_pipe = self._make_ring(storage, 8, warp, q_bar)  # 8 consumer warps
        s_stage = storage.s_q.data_ptr()  # the output's staging, once the query is spent

        if warp >= self.producer_warp:
            cute.arch.warpgroup_reg_dealloc(40)
            if warp == self.producer_warp:
                self._produce(
                    tma_kv_atom, tma_kv, tma_q_atom, tma_q, s_kv, s_q, q_bar, kv_pipe, m_bt,
                    b, rows_per_req, row0, start, end, n_tiles, page_size,
                )  # fmt: skip
        else:
            cute.arch.warpgroup_reg_alloc(232)
            self._consume(
                mma_s, mma_o, s_kv, s_q, s_p, v_layout, q_bar, kv_pipe, s_max, s_alpha, s_sum,
                m_out, m_lse, m_part_o, m_part_lse, scale_log2, q_len, num_heads, num_splits,
                b, split, rows_per_req, row0, start, end, seq_len, n_tiles, tidx, warp,
                s_stage,
            )  # fmt: skip

    @cute.jit
    def _consume(
        self, mma_s, mma_o, s_kv, s_q, s_p, v_layout, q_bar, kv_pipe, s_max, s_alpha, s_sum,
        m_out, m_lse, m_part_o, m_part_lse, scale_log2, q_len, num_heads, num_splits, b, split,
        rows_per_req, row0, start, end, seq_len, n_tiles, tidx, warp, s_stage,
    ):  # fmt: skip
        """A consumer warp group: its tiles' scores and softmax, its half of every P @ V."""
        wg = warp // 4
        wg_tidx = tidx % 128
        lane = cute.arch.lane_idx()
        # -- scores: S = Q @ K^T (64 rows x 64 tokens) ------------------------------------------
        thr_s = mma_s.get_slice(wg_tidx)
        r_sa = mma_s.make_fragment_A(thr_s.partition_A(s_q[None, None, 0]))  # (MMA, 1, 36)
        r_sb = mma_s.make_fragment_B(thr_s.partition_B(s_kv))  # (MMA, 1, 36, stages)
        acc_s = cute.make_rmem_tensor(mma_s.partition_shape_C((ROWS, TILE)), Float32)
        coords_s = thr_s.partition_C(cute.make_identity_tensor((ROWS, TILE)))
        # P is written where S accumulates: s_p is (rows, tokens), the index space of S.
        t_sp = thr_s.partition_C(s_p[None, None, 0])
        r_p = cute.make_rmem_tensor_like(acc_s, BFloat16)
        # -- values: O[:, half] += P @ V[:, half] -------------------------------------------------
        thr_o = mma_o.get_slice(wg_tidx)
        r_oa = mma_o.make_fragment_A(thr_o.partition_A(s_p[None, None, 0]))  # (MMA, 1, 4)
        acc_o = cute.make_rmem_tensor(mma_o.partition_shape_C((ROWS, HALF_V)), Float32)
        coords_o = thr_o.partition_C(cute.make_identity_tensor((ROWS, HALF_V)))
        mma_s.set(warpgroup.Field.ACCUMULATE, True)
        mma_o.set(warpgroup.Field.ACCUMULATE, True)

        # A thread holds two rows (fragment element i is in row half (i // 2) % 2); the four
        # threads of a quad share them.
        m_run = cute.make_rmem_tensor((2,), Float32)  # M of the last published tile
        l_own = cute.make_rmem_tensor((2,), Float32)  # denominators of this group's tiles
        alpha = cute.make_rmem_tensor((2,), Float32)
        m_run.fill(_NEG_INF)
        l_own.fill(0.0)
        my_rows = (coords_s[0][0], coords_s[2][0])
        first_t = seq_len - q_len  # kv position of query token 0

        cute.arch.mbarrier_wait(q_bar, 0)
        acc_o.fill(0.0)
        self._lockstep(
            wg, mma_s, mma_o, acc_s, acc_o, r_sa, r_sb, r_oa, r_p, t_sp, thr_o, s_kv, v_layout,
            kv_pipe, s_max, s_alpha, my_rows, m_run, alpha, l_own, coords_s, scale_log2, start,
            end, n_tiles, first_t, row0, num_heads, lane,
        )  # fmt: skip

        self._finish_rows(
            acc_o, coords_o, l_own, m_run, s_sum, my_rows, wg, lane, b, split, rows_per_req,
            row0, num_splits, m_out, m_lse, m_part_o, m_part_lse, s_stage,
        )  # fmt: skip

    # -- the schedule --------------------------------------------------------------------------

    @cute.jit
    def _lockstep(
        self, wg, mma_s, mma_o, acc_s, acc_o, r_sa, r_sb, r_oa, r_p, t_sp, thr_o, s_kv, v_layout,
        kv_pipe, s_max, s_alpha, my_rows, m_run, alpha, l_own, coords_s, scale_log2, start, end,
        n_tiles, first_t, row0, num_heads, lane,
    ):  # fmt: skip
        """A ring of two stages: both groups finish a tile before either starts the next.

        Each group waits for tile ``t`` and then releases tile ``t - 1``; the owner's scores
        then wait for its product of ``t - 1`` (issuing them earlier would need a third stage).
        Releasing ``t - 1`` first would put the load of ``t + 1`` in flight sooner, yet it
        measured 1.8 / 3.6 % slower at 64 / 128 heads within one H200 run (docs/mla.md).
        """
        for t in cutlass.range(n_tiles, unroll=1):
            warpgroup.wait_group(0)
            kv_pipe.consumer_wait(self._tile_state(t))
            if t > 0:
                kv_pipe.consumer_release(self._tile_state(t - 1))
            if t % 2 == wg:
                self._issue_scores(mma_s, acc_s, r_sa, r_sb, t % self.stages)
                warpgroup.wait_group(0)
                self._softmax(acc_s, r_p, coords_s, m_run, alpha, l_own, scale_log2, start,
                              end, t, first_t, row0, num_heads, lane)  # fmt: skip
                self._publish(r_p, t_sp, s_max, s_alpha, my_rows, m_run, alpha, t % 2, lane,
                              t > 0)  # fmt: skip
            else:
                if t > 0:  # this group's product with P_{t-1} is done: it may be replaced
                    cute.arch.barrier_arrive(
                        barrier_id=_BAR_FREE + (t - 1) % 2, number_of_threads=_PAIR
                    )
                cute.arch.barrier(barrier_id=_BAR_PUB + t % 2, number_of_threads=_PAIR)
                self._receive(s_max, s_alpha, my_rows, m_run, alpha, l_own, t % 2)
            self._rescale(acc_o, alpha)
            self._issue_values(mma_o, acc_o, r_oa, thr_o, s_kv, v_layout, t % self.stages, wg)
        warpgroup.wait_group(0)
        if n_tiles > 0:
            kv_pipe.consumer_release(self._tile_state(n_tiles - 1))

    # -- pieces of a tile ----------------------------------------------------------------------

    @cute.jit
    def _tile_state(self, t):
        """The ring position of tile ``t``: stage ``t % stages``, phase ``(t // stages) % 2``."""
        return pipeline.PipelineState(
            self.stages, Int32(t), Int32(t % self.stages), Int32((t // self.stages) % 2)
        )

    @cute.jit
    def _issue_scores(self, mma_s, acc_s, r_sa, r_sb, stage):
        """``S = Q @ K^T`` over the 576 dims of a stage (committed, not waited)."""
        # Both MMAs accumulate (set once, outside any branch: a TiledMma changed inside one
        # would not dominate its later uses), so the scores start from zeros.
        acc_s.fill(0.0)
        if cutlass.const_expr(self.ablation not in ("no_scores", "no_mma")):
            warpgroup.fence()
            for k in cutlass.range_constexpr(cute.size(r_sa, mode=[2])):
                cute.gemm(mma_s, acc_s, r_sa[None, None, k], r_sb[None, None, k, stage], acc_s)
        warpgroup.commit_group()

    @cute.jit
    def _issue_values(self, mma_o, acc_o, r_oa, thr_o, s_kv, v_layout, stage, wg):
        """``O[:, half] += P @ V[:, half]`` with ``P`` from shared memory (committed)."""
        if cutlass.const_expr(self.ablation not in ("no_values", "no_mma")):
            v_all = cute.make_tensor(s_kv[None, None, stage].iterator, v_layout.outer)
            v_half = cute.local_tile(v_all[None, None, 0], (HALF_V, TILE), (wg, 0))
            r_ob = mma_o.make_fragment_B(thr_o.partition_B(v_half))
            warpgroup.fence()
            for k in cutlass.range_constexpr(cute.size(r_oa, mode=[2])):
                cute.gemm(mma_o, acc_o, r_oa[None, None, k], r_ob[None, None, k], acc_o)
        warpgroup.commit_group()

    @cute.jit
    def _rescale(self, acc_o, alpha):
        """Bring this group's half of ``O`` to the new running max (its two rows)."""
        for i in cutlass.range_constexpr(cute.size(acc_o)):
            acc_o[i] = acc_o[i] * alpha[(i // 2) % 2]

    @cute.jit
    def _publish(self, r_p, t_sp, s_max, s_alpha, my_rows, m_run, alpha, parity, lane, wait_free):
        """Write ``P`` (bf16), the running max and ``alpha`` of a tile of parity ``parity``
        for the other group, then signal it (``PUB``)."""
        if wait_free:  # the other group's product with the previous P (other parity) is done
            cute.arch.barrier(barrier_id=_BAR_FREE + 1 - parity, number_of_threads=_PAIR)
        cute.autovec_copy(r_p, t_sp)
        if lane % 4 == 0:
            for h in cutlass.range_constexpr(2):
                s_max[my_rows[h], parity] = m_run[h]
                s_alpha[my_rows[h], parity] = alpha[h]
        cute.arch.fence_proxy(
            cute.arch.ProxyKind.async_shared, space=cute.arch.SharedSpace.shared_cta
        )
        cute.arch.barrier_arrive(barrier_id=_BAR_PUB + parity, number_of_threads=_PAIR)

    @cute.jit
    def _receive(self, s_max, s_alpha, my_rows, m_run, alpha, l_own, parity):
        """Take the owner's running max and ``alpha`` (after ``PUB``); rescale the sums."""
        for h in cutlass.range_constexpr(2):
            m_run[h] = s_max[my_rows[h], parity]
            alpha[h] = s_alpha[my_rows[h], parity]
            l_own[h] = l_own[h] * alpha[h]

    @cute.jit
    def _softmax(self, acc_s, r_p, coords_s, m_run, alpha, l_own, scale_log2, start, end, tile,
                 first_t, row0, num_heads, lane):  # fmt: skip
        """Scale and mask ``S``, update the running max, write ``P`` (bf16) and ``alpha``."""
        tile_start = start + tile * TILE
        masked = tile_start + TILE > cutlass.min(end, first_t + 1)
        tile_max = cute.make_rmem_tensor((2,), Float32)
        tile_max.fill(_NEG_INF)
        for i in cutlass.range_constexpr(cute.size(acc_s)):
            v = acc_s[i] * scale_log2
            if masked:
                m, n = coords_s[i]
                pos = tile_start + n
                if pos >= end or pos > first_t + (row0 + m) // num_heads:
                    v = Float32(_NEG_INF)
            acc_s[i] = v
            h = (i // 2) % 2
            tile_max[h] = cute.arch.fmax(tile_max[h], v)
        m_use = cute.make_rmem_tensor((2,), Float32)
        for h in cutlass.range_constexpr(2):
            x = tile_max[h]
            x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=1))
            x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=2))
            x = cute.arch.fmax(x, m_run[h])
            mu = x
            if x == _NEG_INF:  # nothing visible yet: keep exp2 finite (P and alpha are 0)
                mu = Float32(0.0)
            alpha[h] = Float32(cute.math.exp2(m_run[h] - mu, fastmath=True))
            m_use[h] = mu
            m_run[h] = x
            l_own[h] = l_own[h] * alpha[h]
        for i in cutlass.range_constexpr(cute.size(acc_s)):
            h = (i // 2) % 2
            p = Float32(cute.math.exp2(acc_s[i] - m_use[h], fastmath=True))
            l_own[h] = l_own[h] + p
            r_p[i] = p.to(BFloat16)
