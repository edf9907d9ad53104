"""Absorbed-MLA decode for Hopper (SM90) in CuTe DSL: 64 query rows on the MMA M axis, two
consumer warp groups that score *two* KV tiles at once and hand the softmax over in a chain
(FlashMLA's "seesaw" of a pair of tiles).

A one-tile seesaw (the ``heads`` layout of the early sessions, removed in the thirty-ninth)
gave every tile to one owner group: the owner scored it and ran its softmax while the other
group waited, so the tensor cores idled during every softmax (the profile in
docs/mla-experiments.md: half the stall samples at 128 heads were the groups waiting on each
other). Here the tiles go in pairs ``(A, B)``, A in one ring stage and B in the next, and each
group scores its own tile of the pair (group 0 tile A, group 1 tile B). ``O[64, 512]`` is split by
columns: group 0 owns ``O_L`` (dims 0-255), group 1 ``O_R`` (256-511). One pair:

1. [0] ``m0 = max(m, rowmax S_A)``, ``scale0 = exp2(m - m0)``; publish both; ``P_A`` (to
   ``m0``) in registers, ``O_L = O_L * scale0 + P_A @ V_AL`` (``P`` straight from registers),
   and ``P_A`` to shared memory while that runs.
2. [1] ``m1 = max(m0, rowmax S_B)``, ``scale1 = exp2(m0 - m1)``; publish;
   ``O_R = O_R * scale0 + P_A @ V_AR``, and tile B's softmax (``P_B``, to ``m1``) while that
   runs; ``P_B`` to shared memory; ``O_R = O_R * scale1 + P_B @ V_BR`` (registers); then the
   scores of the next pair's tile B.
3. [0] ``O_L = O_L * scale1 + P_B @ V_BL``; then the scores of the next pair's tile A.

So group 1 scores the next B while group 0 runs the next softmax, group 0's values product
runs while group 1 runs its softmax, and group 1's first product runs under its own softmax:
the tensor cores always have a product queued. The arithmetic is FlashAttention's online
softmax, reordered. (Until 2026-12-03 group 1 added ``P_A @ V_AR`` last, with ``P_A`` rescaled
to ``m1`` by group 0, so tile A's stage, the first one the next pair needs, was the last to
free: 1.8-3.5 % slower at 64 heads, docs/mla-experiments.md.)

**Loads in halves.** A stage is loaded as two halves with their own full/empty barriers:
``lo`` (dims 0-255) and ``hi`` (dims 256-575), each released by the group whose product reads
it last. Tile A's halves are free once ``P_A @ V_AL`` and ``P_A @ V_AR`` are done, in the first
half of the pair, so the next A is on its way while the pair is still being computed; B's
are free at the pair's end. The halves free up in the order A lo, A hi, B hi, B lo; a producer
warp reads the block table and issues the TMA copies (one 64-dim box at a time) in that order,
and group 1 scores its next tile hi half first.

**Rope blocks released once scored** (``rope_early``, the plan's choice from two 64-row blocks
per request on). The rope dims (512-575) are read by the scores only, so a stage can be three
parts instead of two: lo, hi without the rope block, and the rope block, released by the
tile's scorer as soon as its scores are done. The next pair's rope blocks then load a pair
ahead, and what a pair's end frees is 64 KiB instead of 72. It pays where a tile's hold time
sets the pace (the second row block's loads hit L2), not where DRAM does (one block).

**Tiles of 64 or 32 tokens.** With 64-token tiles a pair fills the ring's two 72 KiB stages,
so the next pair's tile B goes out only at this pair's end and is needed soon after: the
loads set the pace for one 64-row block per request. With 32-token tiles (``tile=32``) the same
144 KiB is four stages and holds two pairs; pair ``p`` uses stages ``2 (p % 2)`` and ``+1``, so
its loads are issued while pair ``p - 1`` is computed. The products are half as wide and the
softmax hand-over comes twice as often per token (the consumer alone is slower), which pays
only where the loads, not the consumer, set the pace; on the H200 it measured from 1.3 % faster
to 4.6 % slower at 64 heads, so the plan takes 64-token tiles (``configs.py``).

**Where ``P`` goes.** Query (72 KiB) and two tiles (144 KiB) leave room for one 8 KiB ``P``
block, not two. ``P_A`` has it; ``P_B`` is written over the query's rope dims, which each group
keeps in registers instead (16 per thread; the scores' last four k-blocks read them from
there), as FlashMLA does.

**Masking** is one branch per tile and selects inside it: with an ``if`` per score element
(as first written) instruction fetch was the top stall of this large kernel (docs/mla.md).

Needs ``nvidia-cutlass-dsl`` (4.3) and an SM90 GPU; bf16 query and cache. The launch wrapper is
``cute_decode.mla_decode`` (plan layout ``"pairs"``).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup

from tokenspeed.kernels.cute_ops.common import staged_rows, store_staged_rows, vector_at

from .cute_decode import TILE, KvRingProducer

ROWS = 64  # query rows per CTA: the wgmma M
D_LATENT = 512
D_ROPE = 64
D_QK = D_LATENT + D_ROPE
HALF_V = D_LATENT // 2  # output dims per consumer warp group
PIECE = 64  # dims per TMA box: one 128-byte swizzle atom
LO_PIECES = HALF_V // PIECE  # the lo half: dims 0-255 (V_L)
_NEG_INF = -math.inf

# Named barriers (0 is __syncthreads), each always arrived by one group and waited on by the
# other (a hardware barrier counts threads, not who arrived).
_BAR_SCALE0 = 1  # group 0 published m0 and scale0
_BAR_SCALE1 = 2  # group 1 published m1 and scale1
_BAR_PA = 3  # group 0 wrote P_A to shared memory
_BAR_PB = 4  # group 1 wrote P_B to shared memory
_BAR_CONSUMERS = 5  # both consumer warp groups (the epilogue)
_BAR_PA_FREE = 6  # group 1's product with P_A is done: the next P_A may be written
_PAIR = 256  # threads of the two consumer warp groups
# Ring parts: index parts * stage + part (0: lo, 1: hi), each released by the four warps of
# the group whose product reads it last: A lo group 0 (V_AL), A hi group 1 (V_AR), B lo group 0
# (V_BL), B hi group 1 (V_BR). They free up in the order A lo, A hi, B hi, B lo, which is the
# producer's order too (one waiting part must not hold back the others).
_RELEASERS = 4
_LOAD_ORDER = ((0, 0), (0, 1), (1, 1), (1, 0))  # (stage, part)
# ``rope_early``: a stage in three parts, the hi half without its rope block (part 1, "mid")
# and the rope block alone (part 2), which only the scores read: each tile's scorer releases
# it as soon as its scores are done, so the next pair's rope blocks load a pair ahead.
_HALVES = ((0, LO_PIECES), (LO_PIECES, D_QK // PIECE))  # (first piece, end) of each part
_THIRDS = ((0, LO_PIECES), (LO_PIECES, D_LATENT // PIECE), (D_LATENT // PIECE, D_QK // PIECE))
_ROPE = 2  # the rope part's index
_LOAD_ORDER_ROPE = ((0, _ROPE), (1, _ROPE), (0, 0), (0, 1), (1, 1), (1, 0))


class TwoGroupRows:
    """The pairs kernel's epilogue: two consumer warp groups, each holding half of
    ``O``'s 512 dims for the same 64 rows and the denominators of the tiles it exponentiated.

    The kernel sets ``split`` (write fp32 partials and base-2 LSEs for the merge) and
    ``write_lse``.
    """

    @cute.jit
    def _finish_rows(
        self, acc_o, coords_o, l_own, m_run, s_sum, my_rows, wg, lane, b, split, rows_per_req,
        row0, num_splits, m_out, m_lse, m_part_o, m_part_lse, s_stage,
    ):  # fmt: skip
        """Add the two groups' denominators, normalise this group's half of ``O`` and write
        it (and, from group 0, the rows' LSE); rows past the request are not written.

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
                inv[h] = 1.0 / total

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


class MlaDecodeSeesawPairsSm90(KvRingProducer, TwoGroupRows):
    """One compiled variant: page copy size, split output or not, LSE or not, the L2
    evict-first hint, a benchmark-only ablation, and the tile size.

    ``tile`` 64: a pair is two 64-token tiles and fills the ring's two stages, so the next
    pair's loads wait for this pair's releases. ``tile`` 32: a pair is one 64-token stretch
    and the ring holds two pairs (four 36 KiB stages), so a pair's loads are issued while the
    pair before it is computed: a whole pair of look-ahead, for smaller products.
    """

    def __init__(
        self, page_block: int, split: bool, write_lse: bool, evict_first: bool = False,
        ablation: str = "", tile: int = TILE, lazy_rescale: bool = False,
        rope_early: bool = False,
    ) -> None:  # fmt: skip
        if tile not in (32, 64):
            raise ValueError(f"tile={tile} must be 32 or 64 tokens")
        if page_block not in (8, 16, 32, 64) or page_block > tile:
            raise ValueError(f"page_block={page_block} must be 8, 16, 32 or 64 and fit a tile")
        # Benchmark-only: "l2_loads" copies every tile from the cache's first boxes (L2
        # hits), so the ring fills at L2 speed and the consumers' own time shows (the results
        # are then wrong; see ``MlaDecodeSm90``).
        if ablation not in ("", "l2_loads"):
            raise ValueError(f"the pairs kernel has no ablation {ablation!r}")
        self.ablation = ablation
        self.rows = ROWS
        self.tile = tile
        self.lazy_rescale = lazy_rescale
        self.rope_early = rope_early
        self.part_pieces = _THIRDS if rope_early else _HALVES
        self.parts = len(self.part_pieces)  # barrier slots per stage
        self.load_order = _LOAD_ORDER_ROPE if rope_early else _LOAD_ORDER
        self.ring_pairs = TILE // tile  # pairs the ring holds at once
        self.stages = 2 * self.ring_pairs  # tile A and tile B of each
        self.page_block = page_block
        self.copies_per_tile = tile // page_block
        self.split = split
        self.write_lse = write_lse
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
        (mma_s, mma_s0, mma_s_rs, mma_o, mma_o_rs), (kv_layout, v_layout, q_layout, p_layout) = (
            self._mmas_and_layouts()
        )
        tma_kv_atom, tma_kv = self._make_piece_tma(m_kv, kv_layout)
        tma_q_atom, tma_q = self._make_q_tma(m_q, q_layout)

        @cute.struct
        class SharedStorage:
            full: cute.struct.MemRange[cutlass.Int64, self.parts * self.stages]
            empty: cute.struct.MemRange[cutlass.Int64, self.parts * self.stages]
            q_bar: cute.struct.MemRange[cutlass.Int64, 1]
            m0: cute.struct.MemRange[Float32, ROWS]  # group 0's running max after tile A
            scale0: cute.struct.MemRange[Float32, ROWS]
            m1: cute.struct.MemRange[Float32, ROWS]  # group 1's running max after tile B
            scale1: cute.struct.MemRange[Float32, ROWS]
            row_sum: cute.struct.MemRange[Float32, 2 * ROWS]  # per-group denominators (end)
            s_kv: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(kv_layout)], 1024]
            s_q: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(q_layout)], 1024]
            s_pa: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(p_layout)], 1024]

        self.shared_storage = SharedStorage
        self.kernel(
            mma_s, mma_s0, mma_s_rs, mma_o, mma_o_rs, tma_kv_atom, tma_kv, tma_q_atom, tma_q,
            kv_layout, v_layout, q_layout, p_layout,
            m_bt, m_seq, m_out, m_lse, m_part_o, m_part_lse,
            scale_log2, q_len, num_heads, num_splits, page_size,
        ).launch(
            grid=[row_blocks, num_splits, batch], block=[self.threads, 1, 1], stream=stream,
            min_blocks_per_mp=1,
        )  # fmt: skip

    @cute.jit
    def _mmas_and_layouts(self):
        """The five tiled MMAs (scores: accumulating, first k-block, rope from registers;
        values: P from shared memory, P from registers) and the shared-memory layouts of the
        ring, its V view, the query block and a P block."""
        k_major = warpgroup.OperandMajorMode.K
        mn_major = warpgroup.OperandMajorMode.MN
        dt = BFloat16

        def scores_mma(a_source=warpgroup.OperandSource.SMEM):
            return sm90_utils.make_trivial_tiled_mma(
                dt, dt, k_major, k_major, Float32, (1, 1, 1), tiler_mn=(ROWS, self.tile),
                a_source=a_source,
            )  # fmt: skip

        mma_s = scores_mma()
        mma_s0 = scores_mma()  # the first k-block of a tile: overwrites the accumulator
        mma_s_rs = scores_mma(warpgroup.OperandSource.RMEM)  # rope k-blocks: Q in registers
        # O[:, half] += P @ V[:, half], P from shared memory (the other group's) ...
        mma_o = sm90_utils.make_trivial_tiled_mma(
            dt, dt, k_major, mn_major, Float32, (1, 1, 1), tiler_mn=(ROWS, HALF_V)
        )
        # ... or from this group's registers
        mma_o_rs = sm90_utils.make_trivial_tiled_mma(
            dt, dt, k_major, mn_major, Float32, (1, 1, 1), tiler_mn=(ROWS, HALF_V),
            a_source=warpgroup.OperandSource.RMEM,
        )  # fmt: skip
        row_major = utils.LayoutEnum.ROW_MAJOR
        q_layout = sm90_utils.make_smem_layout_a(row_major, (ROWS, TILE, D_QK), dt, 1)
        kv_layout = sm90_utils.make_smem_layout_b(
            row_major, (ROWS, self.tile, D_QK), dt, self.stages
        )
        v_layout = sm90_utils.make_smem_layout_b(
            utils.LayoutEnum.COL_MAJOR, (ROWS, D_LATENT, self.tile), dt, 1
        )
        # P blocks stay 64 columns (the 128-byte swizzle the query's rope dims have, where P_B
        # goes); a 32-token tile's P fills the first 32
        p_layout = sm90_utils.make_smem_layout_a(row_major, (ROWS, HALF_V, TILE), dt, 1)
        return (mma_s, mma_s0, mma_s_rs, mma_o, mma_o_rs), (kv_layout, v_layout, q_layout, p_layout)

    @cute.jit
    def _make_piece_tma(self, m_kv: cute.Tensor, kv_layout):
        """The TMA atom of one box: ``page_block`` tokens x 64 dims of a stage (same strides)."""
        kv_stage = cute.slice_(kv_layout, (None, None, 0))
        box_outer = cute.composition(
            kv_stage.outer, cute.make_layout((self.page_block, PIECE), stride=(1, self.tile))
        )
        box_layout = cute.make_composed_layout(kv_stage.inner, 0, box_outer)
        return cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), m_kv, box_layout, (self.page_block, PIECE)
        )

    # -- device side --------------------------------------------------------------------------

    @cute.kernel
    def kernel(
        self,
        mma_s: cute.TiledMma,
        mma_s0: cute.TiledMma,
        mma_s_rs: cute.TiledMma,
        mma_o: cute.TiledMma,
        mma_o_rs: cute.TiledMma,
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
        s_pa = storage.s_pa.get_tensor(p_layout.outer, swizzle=p_layout.inner)
        full = storage.full.data_ptr()
        empty = storage.empty.data_ptr()
        q_bar = storage.q_bar.data_ptr()
        if warp == 0:
            with cute.arch.elect_one():
                for i in cutlass.range_constexpr(self.parts * self.stages):
                    cute.arch.mbarrier_init(full + i, 1)
                    cute.arch.mbarrier_init(empty + i, _RELEASERS)
        self._init_query_barrier(warp, q_bar)  # fences the inits and syncs the CTA

        if warp >= self.producer_warp:
            cute.arch.warpgroup_reg_dealloc(40)
            if warp == self.producer_warp:
                self._produce(
                    tma_kv_atom, tma_kv, tma_q_atom, tma_q, s_kv, s_q, q_bar, full, empty,
                    m_bt, b, rows_per_req, row0, start, end, n_tiles, page_size,
                )  # fmt: skip
        else:
            cute.arch.warpgroup_reg_alloc(232)
            self._consume(
                mma_s, mma_s0, mma_s_rs, mma_o, mma_o_rs, s_kv, s_q, s_pa, v_layout, p_layout,
                q_bar, full, empty, storage, m_out, m_lse, m_part_o, m_part_lse, scale_log2,
                q_len, num_heads, num_splits, b, split, rows_per_req, row0, start, end, seq_len,
                n_tiles, tidx, warp,
            )  # fmt: skip

    @cute.jit
    def _produce(
        self, tma_kv_atom, tma_kv, tma_q_atom, tma_q, s_kv, s_q, q_bar, full, empty, m_bt, b,
        rows_per_req, row0, start, end, n_tiles, page_size,
    ):  # fmt: skip
        """The producer warp: the query block once, then every tile of the split in halves,
        each as soon as the consumers have released its slot."""
        self._load_query(tma_q_atom, tma_q, s_q, q_bar, b, rows_per_req, row0)
        # (box, copies per tile, pieces, stages) view of the ring; (box, box, piece) of the cache
        s_boxes = cute.flat_divide(s_kv, (self.page_block, PIECE))
        g_boxes = cute.local_tile(tma_kv, (self.page_block, PIECE), (None, None))
        t_kvs, t_kvg = cpasync.tma_partition(
            tma_kv_atom, 0, cute.make_layout(1), cute.group_modes(s_boxes, 0, 2),
            cute.group_modes(g_boxes, 0, 2),
        )  # fmt: skip
        # a box wholly past the split's end reads nothing real: point it past the cache (TMA
        # zero-fills it and still counts its bytes)
        n_boxes = Int32(cute.size(g_boxes, mode=[2]))
        cpt = self.copies_per_tile
        n_pairs = (n_tiles + 1) // 2
        # the boxes of a pair's two tiles, read a pair ahead (page_prefetch) or just in time
        ahead = cute.make_rmem_tensor((2 * cpt,), Int32)
        if cutlass.const_expr(self.page_prefetch):
            self._pair_boxes(ahead, m_bt, b, start, end, page_size, n_boxes)
        for p in cutlass.range(n_pairs, unroll=1):
            now = cute.make_rmem_tensor((2 * cpt,), Int32)
            if cutlass.const_expr(self.page_prefetch):
                for i in cutlass.range_constexpr(2 * cpt):
                    now[i] = ahead[i]
                self._pair_boxes(ahead, m_bt, b, start + (2 * p + 2) * self.tile, end,
                                 page_size, n_boxes)  # fmt: skip
            for which, part in self.load_order:
                tile = 2 * p + which
                if tile < n_tiles:
                    stage = self._stage(p, which)
                    slot = self.parts * stage + part
                    if p >= self.ring_pairs:  # released by the pair that held these stages
                        cute.arch.mbarrier_wait(empty + slot, self._phase(p - self.ring_pairs))
                    if cutlass.const_expr(not self.page_prefetch):
                        self._tile_boxes(now, which * cpt, m_bt, b, start + tile * self.tile,
                                         end, page_size, n_boxes)  # fmt: skip
                    first, last = self.part_pieces[part]
                    pieces = last - first
                    with cute.arch.elect_one():
                        cute.arch.mbarrier_arrive_and_expect_tx(
                            full + slot, self.tile * pieces * PIECE * 2
                        )
                    for c in cutlass.range_constexpr(cpt):
                        for k in cutlass.range_constexpr(pieces):
                            cute.copy(
                                tma_kv_atom, t_kvg[(None, now[which * cpt + c], first + k)],
                                t_kvs[(None, c, first + k, stage)], tma_bar_ptr=full + slot,
                                **self._kv_load_hint(),
                            )  # fmt: skip

    @cute.jit
    def _pair_boxes(self, boxes, m_bt, b, pair_start, end, page_size, past_end):
        """The boxes of the two tiles from ``pair_start``: tile ``s``'s at ``s * copies``."""
        for which in cutlass.range_constexpr(2):
            self._tile_boxes(boxes, which * self.copies_per_tile, m_bt, b,
                             pair_start + which * self.tile, end, page_size, past_end)  # fmt: skip

    def _stage(self, pair, which: int):
        """The ring stage of pair ``pair``'s tile A (``which`` 0) or B (1): a compile-time
        constant when the ring holds one pair."""
        if self.ring_pairs == 1:
            return which
        return 2 * (pair % self.ring_pairs) + which

    def _phase(self, pair):
        """The parity of pair ``pair``'s use of its stages' barriers."""
        return (pair // self.ring_pairs) % 2

    @cute.jit
    def _consume(
        self, mma_s, mma_s0, mma_s_rs, mma_o, mma_o_rs, s_kv, s_q, s_pa, v_layout, p_layout,
        q_bar, full, empty, storage, m_out, m_lse, m_part_o, m_part_lse, scale_log2, q_len,
        num_heads, num_splits, b, split, rows_per_req, row0, start, end, seq_len, n_tiles, tidx,
        warp,
    ):  # fmt: skip
        """A consumer warp group: its tile of every pair, its half of every ``P @ V``."""
        wg = warp // 4
        wg_tidx = tidx % 128
        # What the pair bodies only read, bundled at trace time. What they write is passed by
        # name: a loop or branch region carries only the variables it names.
        c = SimpleNamespace(
            lane=cute.arch.lane_idx(), mma_s=mma_s, mma_s0=mma_s0, mma_s_rs=mma_s_rs,
            mma_o=mma_o, mma_o_rs=mma_o_rs, s_kv=s_kv, v_layout=v_layout, full=full,
            empty=empty, storage=storage, scale_log2=scale_log2, start=start, end=end,
            row0=row0, num_heads=num_heads, first_t=seq_len - q_len,  # kv pos of query token 0
        )  # fmt: skip
        # -- scores: S = Q @ K^T (64 rows x tile tokens) --------------------------------------
        thr_s = mma_s.get_slice(wg_tidx)
        c.r_sa = mma_s.make_fragment_A(thr_s.partition_A(s_q[None, None, 0]))  # (MMA, 1, 36)
        c.r_sb = mma_s.make_fragment_B(thr_s.partition_B(s_kv))  # (MMA, 1, 36, stages)
        acc_s = cute.make_rmem_tensor(mma_s.partition_shape_C((ROWS, self.tile)), Float32)
        c.coords_s = thr_s.partition_C(cute.make_identity_tensor((ROWS, self.tile)))
        coords_s = c.coords_s
        # The query's rope dims go to registers (the scores' last k-blocks read them from
        # there), so their 8 KiB of shared memory can hold P_B. P_A has its own block.
        q_rope = cute.make_tensor(s_q[None, None, 0].iterator + ROWS * D_LATENT, p_layout.outer)
        p_views = [
            cute.local_tile(v[None, None, 0], (ROWS, self.tile), (0, 0)) for v in (s_pa, q_rope)
        ]
        thr_s_rs = mma_s_rs.get_slice(wg_tidx)
        c.r_q8 = cute.make_rmem_tensor(mma_s_rs.partition_shape_A((ROWS, PIECE)), BFloat16)
        c.r_sb_rs = mma_s_rs.make_fragment_B(thr_s_rs.partition_B(s_kv))
        # -- values: O[:, half] += P @ V[:, half] -------------------------------------------------
        thr_o = mma_o.get_slice(wg_tidx)
        c.thr_o = thr_o
        c.thr_o_rs = mma_o_rs.get_slice(wg_tidx)
        c.r_oa = [mma_o.make_fragment_A(thr_o.partition_A(v)) for v in p_views]
        # The scores accumulator and a register A operand list their values in the same order
        # (pairs of columns, row halves, 8-column blocks), so P converts element by element.
        r_pa = cute.make_rmem_tensor(mma_o_rs.partition_shape_A((ROWS, self.tile)), BFloat16)
        r_p = cute.make_rmem_tensor_like(acc_s, BFloat16)  # the same, to write to shared memory
        c.thr_s, c.p_views = thr_s, p_views
        acc_o = cute.make_rmem_tensor(mma_o.partition_shape_C((ROWS, HALF_V)), Float32)
        coords_o = thr_o.partition_C(cute.make_identity_tensor((ROWS, HALF_V)))
        # Set once, outside any branch (a TiledMma changed inside one would not dominate its
        # later uses): a tile's first k-block overwrites S, so nothing zero-fills it while
        # another product is in flight (ptxas would serialise every wgmma: C7515).
        mma_s0.set(warpgroup.Field.ACCUMULATE, False)
        mma_s.set(warpgroup.Field.ACCUMULATE, True)
        mma_s_rs.set(warpgroup.Field.ACCUMULATE, True)
        mma_o.set(warpgroup.Field.ACCUMULATE, True)
        mma_o_rs.set(warpgroup.Field.ACCUMULATE, True)

        s_sum = storage.row_sum.get_tensor(cute.make_layout((ROWS, 2)))

        # A thread holds two rows (fragment element i is in row half (i // 2) % 2); the four
        # threads of a quad share them.
        m_run = cute.make_rmem_tensor((2,), Float32)  # the running max after the last tile
        l_own = cute.make_rmem_tensor((2,), Float32)  # denominators of this group's tiles
        m_run.fill(_NEG_INF)
        l_own.fill(0.0)
        my_rows = (coords_s[0][0], coords_s[2][0])
        c.my_rows = my_rows
        n_pairs = (n_tiles + 1) // 2

        cute.arch.mbarrier_wait(q_bar, 0)
        self._prepare_query(storage, tidx)
        cute.autovec_copy(thr_s_rs.partition_A(q_rope[None, None, 0]), c.r_q8)
        acc_o.fill(0.0)
        # the first pair's scores: group 0 tile 0, group 1 tile 1
        # (each wait inside its branch: no wgmma may be in flight where branches join)
        if wg == 0 and n_tiles > 0:
            self._score_tile(c, acc_s, 0, 0)
        if wg == 1 and n_tiles > 1:
            self._score_tile(c, acc_s, 1, 0)
        # Whether tile B and the next pair's tile exist picks one of three compiled bodies, so
        # no wgmma sits in a branch within a body: where branches join, ptxas would have to
        # merge registers a wgmma may still be writing, and it then serialises every wgmma of
        # the kernel (warning C7515; FlashMLA's source notes the same).
        if wg == 1:  # group 0 waits for this arrival before each P_A it writes
            cute.arch.barrier_arrive(barrier_id=_BAR_PA_FREE, number_of_threads=_PAIR)
        for p in cutlass.range(n_pairs, unroll=1):
            left = n_tiles - 2 * p  # tiles from this pair's A on
            if wg == 0:
                if left > 2:
                    self._pair_group0(c, acc_s, acc_o, m_run, l_own, r_pa, r_p, p, True, True)
                elif left == 2:
                    self._pair_group0(c, acc_s, acc_o, m_run, l_own, r_pa, r_p, p, True, False)
                else:
                    self._pair_group0(c, acc_s, acc_o, m_run, l_own, r_pa, r_p, p, False, False)
            else:
                if left > 3:
                    self._pair_group1(c, acc_s, acc_o, m_run, l_own, r_pa, r_p, p, True, True)
                elif left > 1:
                    self._pair_group1(c, acc_s, acc_o, m_run, l_own, r_pa, r_p, p, True, False)
                else:
                    self._pair_group1(c, acc_s, acc_o, m_run, l_own, r_pa, r_p, p, False, False)
        if wg == 0:  # the last pair's arrival
            cute.arch.barrier(barrier_id=_BAR_PA_FREE, number_of_threads=_PAIR)

        self._finish_rows(
            acc_o, coords_o, l_own, m_run, s_sum, my_rows, wg, c.lane, b, split, rows_per_req,
            row0, num_splits, m_out, m_lse, m_part_o, m_part_lse,
            storage.s_q.data_ptr(),
        )  # fmt: skip

    @cute.jit
    def _prepare_query(self, storage, tidx):
        """The query block has landed; a kernel that multiplies in another type converts it
        here (both consumer groups, before either scores). This one takes it as it is."""

    # -- the two groups' parts of a pair ------------------------------------------------------

    @cute.jit
    def _pair_group0(self, c, acc_s, acc_o, m_run, l_own, r_pa, r_p, p,
                     has_b: cutlass.Constexpr, has_next: cutlass.Constexpr):  # fmt: skip
        """Tile A's softmax, ``O_L += P_A @ V_AL``, hand ``P_A`` over, ``O_L += P_B @ V_BL``
        (``has_b``), then the next tile A's scores (``has_next``; left in ``acc_s``)."""
        my_rows = c.my_rows
        tile_max = cute.make_rmem_tensor((2,), Float32)
        self._mask_and_max(c, acc_s, tile_max, p, 0)
        mu = cute.make_rmem_tensor((2,), Float32)
        scale = cute.make_rmem_tensor((2,), Float32)
        for h in cutlass.range_constexpr(2):
            x = cute.arch.fmax(tile_max[h], m_run[h])
            mu[h] = x
            if x == _NEG_INF:  # nothing visible yet: keep exp2 finite (P and scale are 0)
                mu[h] = Float32(0.0)
            scale[h] = Float32(cute.math.exp2(m_run[h] - mu[h], fastmath=True))
            m_run[h] = x
        s_m0, s_scale0, s_m1, s_scale1 = self._exchange(c)
        if c.lane % 4 == 0:
            for h in cutlass.range_constexpr(2):
                s_m0[my_rows[h]] = m_run[h]
                s_scale0[my_rows[h]] = scale[h]
        cute.arch.barrier_arrive(barrier_id=_BAR_SCALE0, number_of_threads=_PAIR)
        self._rescale(acc_o, l_own, scale)
        self._exponentiate(c, acc_s, l_own, r_pa, r_p, mu, p, 0)
        self._issue_values(c, acc_o, r_pa, True, p, 0, 0)  # O_L += P_A @ V_AL, P_A in registers
        # P_A (to m0) for group 1's P_A @ V_AR, once its product with the last one is done
        cute.arch.barrier(barrier_id=_BAR_PA_FREE, number_of_threads=_PAIR)
        self._hand_over(c, r_p, 0, _BAR_PA)
        warpgroup.wait_group(0)
        self._release(c, p, 0, 0)  # A lo: V_AL read, A scored
        # group 1's softmax of tile B: its max is the running max now
        cute.arch.barrier(barrier_id=_BAR_SCALE1, number_of_threads=_PAIR)
        for h in cutlass.range_constexpr(2):
            m_run[h] = s_m1[my_rows[h]]
            scale[h] = s_scale1[my_rows[h]]
        self._rescale(acc_o, l_own, scale)
        if cutlass.const_expr(has_b):
            cute.arch.barrier(barrier_id=_BAR_PB, number_of_threads=_PAIR)
            self._issue_values(c, acc_o, r_pa, False, p, 1, 0)  # O_L += P_B @ V_BL
            if cutlass.const_expr(has_next):  # the next A's lo half: released early this pair
                self._issue_scores_part(c, acc_s, 0, p + 1, 0, True)
                warpgroup.wait_group(1)
            else:
                warpgroup.wait_group(0)
            self._release(c, p, 1, 0)  # B lo: V_BL read
            if cutlass.const_expr(has_next):
                self._issue_scores_part(c, acc_s, 0, p + 1, 1, False)
                if cutlass.const_expr(self.rope_early):
                    self._issue_scores_part(c, acc_s, 0, p + 1, _ROPE, False)
                    warpgroup.wait_group(0)
                    self._release(c, p + 1, 0, _ROPE)  # the next A's rope block: scored
                else:
                    warpgroup.wait_group(0)

    @cute.jit
    def _pair_group1(self, c, acc_s, acc_o, m_run, l_own, r_pa, r_p, p,
                     has_b: cutlass.Constexpr, has_next: cutlass.Constexpr):  # fmt: skip
        """``O_R += P_A @ V_AR`` under tile B's softmax (after group 0's max), ``O_R += P_B @
        V_BR`` (``has_b``), then the next tile B's scores (``has_next``; left in ``acc_s``)."""
        my_rows = c.my_rows
        tile_max = cute.make_rmem_tensor((2,), Float32)
        tile_max.fill(_NEG_INF)
        if cutlass.const_expr(has_b):
            self._mask_and_max(c, acc_s, tile_max, p, 1)
        cute.arch.barrier(barrier_id=_BAR_SCALE0, number_of_threads=_PAIR)
        s_m0, s_scale0, s_m1, s_scale1 = self._exchange(c)
        mu = cute.make_rmem_tensor((2,), Float32)
        scale = cute.make_rmem_tensor((2,), Float32)
        scale0 = cute.make_rmem_tensor((2,), Float32)
        for h in cutlass.range_constexpr(2):
            m0 = s_m0[my_rows[h]]
            scale0[h] = s_scale0[my_rows[h]]
            x = cute.arch.fmax(tile_max[h], m0)
            mu[h] = x
            if x == _NEG_INF:
                mu[h] = Float32(0.0)
            scale[h] = Float32(cute.math.exp2(m0 - mu[h], fastmath=True))
            m_run[h] = x
        if c.lane % 4 == 0:
            for h in cutlass.range_constexpr(2):
                s_m1[my_rows[h]] = m_run[h]
                s_scale1[my_rows[h]] = scale[h]
        cute.arch.barrier_arrive(barrier_id=_BAR_SCALE1, number_of_threads=_PAIR)
        for h in cutlass.range_constexpr(2):  # the sums so far, before P_B's are added
            l_own[h] = l_own[h] * (scale0[h] * scale[h])
        # O_R to m0, O_R += P_A @ V_AR under this group's softmax of tile B (so tile A's hi
        # half frees mid-pair), then O_R to m1 and O_R += P_B @ V_BR
        self._rescale(acc_o, None, scale0)
        cute.arch.barrier(barrier_id=_BAR_PA, number_of_threads=_PAIR)
        self._issue_values(c, acc_o, r_pa, False, p, 0, 1)  # O_R += P_A @ V_AR
        if cutlass.const_expr(has_b):
            self._exponentiate(c, acc_s, l_own, r_pa, r_p, mu, p, 1)
        warpgroup.wait_group(0)
        self._release(c, p, 0, 1)  # A hi: V_AR read
        cute.arch.barrier_arrive(barrier_id=_BAR_PA_FREE, number_of_threads=_PAIR)
        if cutlass.const_expr(has_b):  # (before the wait above: measured 0.6-0.9 % slower)
            self._hand_over(c, r_p, 1, _BAR_PB)
        self._rescale(acc_o, None, scale)
        if cutlass.const_expr(has_b):
            self._issue_values(c, acc_o, r_pa, True, p, 1, 1)  # O_R += P_B @ V_BR (registers)
            warpgroup.wait_group(0)
            self._release(c, p, 1, 1)  # B hi: V_BR read
        if cutlass.const_expr(has_next):  # the next tile B: hi half first, it was freed first
            self._score_tile(c, acc_s, 1, p + 1)

    # -- pieces of a pair ----------------------------------------------------------------------

    @cute.jit
    def _score_tile(self, c, acc_s, which: cutlass.Constexpr, pair):
        """``S`` of pair ``pair``'s tile A (``which`` 0, lo half first) or B (hi half first),
        waited for: each group takes its tile's halves in the order the producer loads them.
        ``rope_early``: the rope block last (it landed a pair ahead), then released."""
        self._issue_scores_part(c, acc_s, which, pair, which, True)
        self._issue_scores_part(c, acc_s, which, pair, 1 - which, False)
        if cutlass.const_expr(self.rope_early):
            self._issue_scores_part(c, acc_s, which, pair, _ROPE, False)
            warpgroup.wait_group(0)
            self._release(c, pair, which, _ROPE)
        else:
            warpgroup.wait_group(0)

    @cute.jit
    def _issue_scores_part(self, c, acc_s, which: cutlass.Constexpr, pair,
                           part: cutlass.Constexpr, first: cutlass.Constexpr):  # fmt: skip
        """Wait for one part of pair ``pair``'s tile A (``which`` 0) or B and add its dims to
        ``S`` (committed, not waited). The ``first`` part issued starts ``S`` (overwrites it);
        the rope dims' k-blocks take the query from registers."""
        stage = self._stage(pair, which)
        cute.arch.mbarrier_wait(c.full + self.parts * stage + part, self._phase(pair))
        warpgroup.fence()
        n_k = cute.size(c.r_sa, mode=[2])
        k_rope = n_k - cute.size(c.r_q8, mode=[2])
        k_per_piece = PIECE // 16
        k0 = self.part_pieces[part][0] * k_per_piece
        k1 = self.part_pieces[part][1] * k_per_piece
        for k in cutlass.range_constexpr(k0, k1):
            if cutlass.const_expr(k >= k_rope):
                cute.gemm(c.mma_s_rs, acc_s, c.r_q8[None, None, k - k_rope],
                          c.r_sb_rs[None, None, k, stage], acc_s)  # fmt: skip
            else:
                mma = c.mma_s0 if first and k == k0 else c.mma_s
                cute.gemm(mma, acc_s, c.r_sa[None, None, k], c.r_sb[None, None, k, stage],
                          acc_s)  # fmt: skip
        warpgroup.commit_group()

    @cute.jit
    def _issue_values(self, c, acc_o, r_pa, own: cutlass.Constexpr, pair,
                      which: cutlass.Constexpr, half: cutlass.Constexpr):  # fmt: skip
        """``O[:, half] += P @ V[:, half]`` of pair ``pair``'s tile A or B (``which``;
        committed): ``P`` from this group's registers (``own``) or from shared memory (the
        other group's)."""
        mma = c.mma_o_rs if own else c.mma_o
        thr = c.thr_o_rs if own else c.thr_o
        stage = self._stage(pair, which)
        v_all = cute.make_tensor(c.s_kv[None, None, stage].iterator, c.v_layout.outer)
        v_half = cute.local_tile(v_all[None, None, 0], (HALF_V, self.tile), (half, 0))
        r_ob = mma.make_fragment_B(thr.partition_B(v_half))
        r_oa = r_pa if own else c.r_oa[which]
        warpgroup.fence()
        for k in cutlass.range_constexpr(cute.size(r_oa, mode=[2])):
            cute.gemm(mma, acc_o, r_oa[None, None, k], r_ob[None, None, k], acc_o)
        warpgroup.commit_group()

    @cute.jit
    def _release(self, c, pair, which: cutlass.Constexpr, part: cutlass.Constexpr):
        """This warp is done with a part of pair ``pair``'s tile A or B (its products reading
        it have completed)."""
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive(c.empty + self.parts * self._stage(pair, which) + part)

    @cute.jit
    def _exchange(self, c):
        """Views of the running maxima and scales the groups publish (made afresh at each use:
        a view written inside a loop or branch must not outlive it)."""
        row = cute.make_layout(ROWS)
        st = c.storage
        return (st.m0.get_tensor(row), st.scale0.get_tensor(row), st.m1.get_tensor(row),
                st.scale1.get_tensor(row))  # fmt: skip

    @cute.jit
    def _hand_over(self, c, r_p, which: cutlass.Constexpr, bar):
        """Write ``P`` (bf16) for the other group's product (P_A: ``which`` 0, P_B: 1) and
        signal it."""
        cute.autovec_copy(r_p, c.thr_s.partition_C(c.p_views[which]))
        cute.arch.fence_proxy(
            cute.arch.ProxyKind.async_shared, space=cute.arch.SharedSpace.shared_cta
        )
        cute.arch.barrier_arrive(barrier_id=bar, number_of_threads=_PAIR)

    @cute.jit
    def _rescale(self, acc_o, l_own, scale):
        """Bring this group's half of ``O`` and (unless ``None``) its denominators to a new
        running max. ``lazy_rescale``: a thread whose two rows kept their max (both scales
        exactly 1, the common case once the max has settled) skips its 128 multiplies, which
        change nothing then."""
        if cutlass.const_expr(self.lazy_rescale):
            if scale[0] * scale[1] < Float32(1.0):  # both are at most 1
                for i in cutlass.range_constexpr(cute.size(acc_o)):
                    acc_o[i] = acc_o[i] * scale[(i // 2) % 2]
        else:
            for i in cutlass.range_constexpr(cute.size(acc_o)):
                acc_o[i] = acc_o[i] * scale[(i // 2) % 2]
        if cutlass.const_expr(l_own is not None):
            for h in cutlass.range_constexpr(2):
                l_own[h] = l_own[h] * scale[h]

    @cute.jit
    def _exponentiate(self, c, acc_s, l_own, r_pa, r_p, mu, pair, which: cutlass.Constexpr):
        """``P = exp2(S - mu)`` in place (fp32), its bf16 copies (a register A operand, and
        one in the accumulator's layout to hand over), and the denominators."""
        for i in cutlass.range_constexpr(cute.size(acc_s)):
            h = (i // 2) % 2
            x = Float32(cute.math.exp2(acc_s[i] - mu[h], fastmath=True))
            acc_s[i] = x
            l_own[h] = l_own[h] + x
            y = x.to(BFloat16)
            r_pa[i] = y
            r_p[i] = y

    @cute.jit
    def _mask_and_max(self, c, acc_s, tile_max, pair, which: cutlass.Constexpr):
        """Scale ``S`` of pair ``pair``'s tile A or B (``which``) to base 2 and mask it (past
        the split, causal); its row maxima into ``tile_max``. One branch per tile, selects
        within it: a branch per element (the obvious ``if`` inside the loop) made the
        instruction fetch the top stall."""
        tile_start = c.start + (2 * pair + which) * self.tile
        for i in cutlass.range_constexpr(cute.size(acc_s)):
            acc_s[i] = acc_s[i] * c.scale_log2
        if tile_start + self.tile > cutlass.min(c.end, c.first_t + 1):
            # the first masked column of each of this thread's two rows, from the tile start
            bound0 = cutlass.min(c.end, c.first_t + 1 + (c.row0 + c.my_rows[0]) // c.num_heads)
            bound1 = cutlass.min(c.end, c.first_t + 1 + (c.row0 + c.my_rows[1]) // c.num_heads)
            bounds = (bound0 - tile_start, bound1 - tile_start)
            for i in cutlass.range_constexpr(cute.size(acc_s)):
                n = Int32(c.coords_s[i][1])
                bound = bounds[(i // 2) % 2]
                acc_s[i] = Float32(cutlass.select_(n >= bound, Float32(_NEG_INF), acc_s[i]))
        tile_max.fill(_NEG_INF)
        for i in cutlass.range_constexpr(cute.size(acc_s)):
            h = (i // 2) % 2
            tile_max[h] = cute.arch.fmax(tile_max[h], acc_s[i])
        for h in cutlass.range_constexpr(2):
            x = tile_max[h]
            x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=1))
            x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=2))
            tile_max[h] = x
