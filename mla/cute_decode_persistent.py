"""The tokens-on-M MLA decode (``cute_decode.py``) on a persistent grid: one CTA per SM, each
taking an equal share of all requests' KV tiles.

One CTA per (request, row block) leaves SMs idle whenever the batch is not a multiple of the
SM count: FlashMLA's batch of 128 requests fills 128 of the H200's 132 SMs, and 200 requests
take two waves of which the second is half empty. Here the requests' tiles are laid end to
end (a request of no tokens counts one tile, so that some CTA writes its zeros) and CTA ``c``
of ``G`` takes tiles ``[c T / G, (c + 1) T / G)``. That run crosses request ends, so a CTA
serves a few *segments* (request, tile range) in turn. Only its first and last segment can
hold part of a request; the others are whole requests, written as final rows. A part is
merged by the CTA that finishes its part last: at once, from registers and L2, when the other
of two parts is already written (the usual case); otherwise each part is written (fp32, in
the consumer threads' order, with base-2 LSEs by row) into its CTA's slot (two per CTA) and
counted (an atomic count per request, reset by the merging CTA for the next launch), and the
last one folds them in CTA order. The bits do not depend on which CTA merged. Nothing else
is launched: no split count, no merge kernel.

Writing a part in the middle of a run stalls the CTA's ring: while the other SMs stream
tiles, a 64 KiB part takes this SM 6-20 us to store (timed per CTA on the H200, docs/mla.md),
and no equal share of tiles makes up for that, so this grid stays slower than one CTA per
request.

The segment table is not built anywhere: each warp derives its CTA's segments from the
sequence lengths (two passes over the requests: warp-wide sums, then a scan and ballots), so
the launch is the same for every batch of the same size and fits a CUDA graph. The producer
loads each segment's query block into one of two query stages (its own pipeline), so the next
segment's query and tiles are in flight while the consumers finish the current one.
"""

from __future__ import annotations

import math
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float32, Int32
from cutlass._mlir.dialects import nvvm
from cutlass._mlir.dialects.nvvm import AtomicOpKind, MemOrderKind, MemScopeKind
from cutlass.cutlass_dsl import T, dsl_user_op

from tokenspeed.kernels.cute_ops.common import accumulator_column, accumulator_slot, ptx_i32

from .cute_decode import D_LATENT, D_QK, TILE, MlaDecodeSm90

_NEG_INF = -math.inf
SCAN_UNROLL = 4  # sequence lengths each lane loads at once in the first pass


@dsl_user_op
def count_parts(ptr: cute.Pointer, add: int, *, loc=None, ip=None) -> Int32:
    """Add ``add`` (1 to count a written part, 0 to read) to the int32 at ``ptr``, atomically
    with acquire-release order at GPU scope; returns what it held: the parts of a request
    written before."""
    return Int32(
        nvvm.atomicrmw(
            T.i32(),
            AtomicOpKind.ADD,
            ptr.llvm_ptr,
            Int32(add).ir_value(loc=loc, ip=ip),
            mem_order=MemOrderKind.ACQ_REL,
            syncscope=MemScopeKind.GPU,
            loc=loc,
            ip=ip,
        )
    )


@dsl_user_op
def load_acquire(ptr: cute.Pointer, *, loc=None, ip=None) -> Int32:
    """The int32 at ``ptr``, loaded with acquire order at GPU scope: a read of a part count
    that orders the loads of the parts after it, with no fence (``MEMBAR``) of its own."""
    ptx = "ld.acquire.gpu.global.b32 $0, [$1];"
    return Int32(ptx_i32(ptx, "=r,l", [ptr.llvm_ptr], side_effects=True, loc=loc, ip=ip))


@cute.jit
def unit_tiles(seq_len: Int32) -> Int32:
    """Tiles a (request, row block) takes on the shared line: its KV tiles, at least one."""
    return cutlass.max((seq_len + TILE - 1) // TILE, 1)


@cute.jit
def warp_sum(x: Int32) -> Int32:
    """``x`` summed over the warp (every lane gets the sum)."""
    return cute.arch.warp_reduction(x, lambda a, b: a + b)


@cute.jit
def warp_inclusive_sum(x: Int32, lane: Int32) -> Int32:
    """The sum of ``x`` over lanes ``0..lane``."""
    for k in cutlass.range_constexpr(5):
        y = cute.arch.shuffle_sync_up(x, offset=1 << k, mask_and_clamp=0)
        if lane >= (1 << k):
            x = x + y
    return x


class MlaDecodePersistentSm90(MlaDecodeSm90):
    """One compiled persistent variant: 16 or 32 rows on one consumer warp group."""

    def __init__(
        self, rows: int, page_block: int, write_lse: bool, ablation: str = "",
        evict_first: bool = False,
    ) -> None:  # fmt: skip
        if rows not in (16, 32):
            raise ValueError(f"rows={rows}: the persistent decode takes 16 or 32 rows per CTA")
        super().__init__(rows, 1, page_block, 2, False, write_lse, ablation, evict_first)

    # -- host side ----------------------------------------------------------------------------

    @cute.jit
    def __call__(
        self,
        m_q: cute.Tensor,  # [rows_total, 576] bf16
        m_kv: cute.Tensor,  # [pages * page_size, 576] bf16
        m_bt: cute.Tensor,  # [batch, max_pages] int32
        m_seq: cute.Tensor,  # [batch] int32
        m_out: cute.Tensor,  # [rows_total, 512] bf16
        m_lse: cute.Tensor,  # [rows_total] fp32, natural log
        m_part_o: cute.Tensor,  # [2 * ctas * rows, 512] fp32: two part slots per CTA
        m_part_lse: cute.Tensor,  # [2 * ctas * rows] fp32, base 2
        m_count: cute.Tensor,  # [batch * row_blocks] int32, zero between launches
        scale_log2: Float32,
        q_len: Int32,
        num_heads: Int32,
        page_size: Int32,
        batch: Int32,
        row_blocks: Int32,
        ctas: Int32,
        stream: cuda.CUstream,
    ):
        mma_s, mma_o, kv_layout, vt_layout, _, p_layout = self._mmas_and_layouts()
        q_layout = sm90_utils.make_smem_layout_b(
            utils.LayoutEnum.ROW_MAJOR, (TILE, self.rows, D_QK), BFloat16, 2
        )
        tma_kv_atom, tma_kv, tma_q_atom, tma_q = self._make_tmas(m_q, m_kv, q_layout, kv_layout)

        @cute.struct
        class SharedStorage:
            kv_full_empty: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            q_bar: cute.struct.MemRange[cutlass.Int64, 2 * 2]  # the query stages' pipeline
            red: cute.struct.MemRange[Float32, 2 * 4 * self.rows_per_wg]
            alpha: cute.struct.MemRange[Float32, self.rows]
            row_max: cute.struct.MemRange[Float32, self.rows]
            row_sum: cute.struct.MemRange[Float32, self.rows]
            # after the float arrays (a 4-byte field before them halved their access width);
            # only the first entry is used
            flag: cute.struct.MemRange[Int32, 2]
            s_kv: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(kv_layout)], 1024]
            s_q: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(q_layout)], 1024]
            s_p: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(p_layout)], 1024]

        self.shared_storage = SharedStorage
        self.kernel(
            mma_s, mma_o, tma_kv_atom, tma_kv, tma_q_atom, tma_q,
            kv_layout, vt_layout, q_layout, p_layout,
            m_bt, m_seq, m_out, m_lse, m_part_o, m_part_lse, m_count,
            scale_log2, q_len, num_heads, page_size, batch, row_blocks,
        ).launch(
            grid=[ctas, 1, 1], block=[self.threads, 1, 1], stream=stream, min_blocks_per_mp=1,
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
        vt_layout: cute.ComposedLayout,
        q_layout: cute.ComposedLayout,
        p_layout: cute.ComposedLayout,
        m_bt: cute.Tensor,
        m_seq: cute.Tensor,
        m_out: cute.Tensor,
        m_lse: cute.Tensor,
        m_part_o: cute.Tensor,
        m_part_lse: cute.Tensor,
        m_count: cute.Tensor,
        scale_log2: Float32,
        q_len: Int32,
        num_heads: Int32,
        page_size: Int32,
        batch: Int32,
        row_blocks: Int32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()

        units = batch * row_blocks
        total = self._total_tiles(m_seq, units, row_blocks, lane)
        # with fewer tiles than CTAs the last CTAs get none, and every other run is non-empty
        # (so a unit's parts are its CTAs from the first to the last)
        ctas = cutlass.min(grid, total)
        lo = total
        hi = total
        if cta < ctas:
            lo = cta * total // ctas
            hi = (cta + 1) * total // ctas
        line = self._first_segment(m_seq, units, row_blocks, lo, hi, lane)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        s_kv, s_q, s_p, _, red, s_alpha, s_max, s_sum = self._consumer_smem(
            storage, kv_layout, q_layout, p_layout
        )
        kv_pipe = self._tma_pipeline(
            storage.kv_full_empty.data_ptr(), self.stages, 4, TILE * D_QK * 2
        )
        q_pipe = self._tma_pipeline(storage.q_bar.data_ptr(), 2, 4, self.rows * D_QK * 2)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        rows_per_req = q_len * num_heads
        flag = storage.flag.get_tensor(cute.make_layout(1))
        if warp == self.producer_warp:
            self._produce_segments(
                tma_kv_atom, tma_kv, tma_q_atom, tma_q, s_kv, s_q, kv_pipe, q_pipe, m_bt,
                m_seq, line, lo, hi, rows_per_req, row_blocks, page_size,
            )  # fmt: skip
        elif warp < self.producer_warp:
            c = self._consumer_setup(
                mma_s, mma_o, s_kv, s_p, vt_layout, red, s_alpha, s_max, s_sum, scale_log2,
                q_len, num_heads, tidx, warp, lane, None, None,
            )  # fmt: skip
            self._consume_segments(
                c, s_q, kv_pipe, q_pipe, m_seq, m_out, m_lse, m_part_o, m_part_lse, m_count,
                line, rows_per_req, row_blocks, flag, (cta, ctas, total, lo, hi),
            )  # fmt: skip

    # -- the shared line of tiles -------------------------------------------------------------

    @cute.jit
    def _total_tiles(self, m_seq, units, row_blocks, lane):
        """Tiles on the line: every (request, row block)'s, summed by a warp."""
        total = Int32(0)
        chunk = 32 * SCAN_UNROLL
        for base in cutlass.range(0, units, chunk, unroll=1):
            mine = Int32(0)
            for k in cutlass.range_constexpr(SCAN_UNROLL):  # unconditional loads, all in flight
                u = base + k * 32 + lane
                nt = unit_tiles(m_seq[cutlass.min(u, units - 1) // row_blocks])
                if u < units:
                    mine = mine + nt
            total = total + warp_sum(mine)
        return total

    @cute.jit
    def _first_segment(self, m_seq, units, row_blocks, lo, hi, lane):
        """Where this CTA's run ``[lo, hi)`` starts on the line: ``(first unit, the line
        position of that unit's first tile, segments)``, from counts over the units that end
        at or before ``lo`` and those that start before ``hi``."""
        done = Int32(0)  # units ending at or before lo
        done_tiles = Int32(0)  # their tiles
        started = Int32(0)  # units starting before hi
        run = Int32(0)
        for base in cutlass.range(0, units, 32, unroll=1):
            u = base + lane
            nt = unit_tiles(m_seq[cutlass.min(u, units - 1) // row_blocks])
            if u >= units:
                nt = Int32(0)
            end = run + warp_inclusive_sum(nt, lane)
            # a unit's start and end grow with u, so both sets are prefixes of the 32 units:
            # a ballot counts them, and the last unit ending by lo is lane (count - 1)
            ended = cute.arch.popc(cute.arch.vote_ballot_sync(u < units and end <= lo))
            begun = cute.arch.popc(cute.arch.vote_ballot_sync(u < units and end - nt < hi))
            last_end = cute.arch.shuffle_sync(end, cutlass.max(ended - 1, 0))
            if ended > 0:
                done_tiles = last_end
            done = done + ended
            started = started + begun
            run = cute.arch.shuffle_sync(end, 31)
        n_segs = started - done
        if hi <= lo:
            n_segs = Int32(0)
        return done, done_tiles, n_segs

    @cute.jit
    def _segment(self, m_seq, u, at, lo, hi, row_blocks):
        """Segment of unit ``u`` (whose first tile is at line position ``at``) inside the run:
        ``(request, seq_len, unit tiles, start, end, KV tiles, tiles of the unit outside the
        run)``; the last is 0 when the segment is the whole unit."""
        b = u // row_blocks
        seq_len = m_seq[b]
        nt = unit_tiles(seq_len)
        t0 = cutlass.max(lo - at, 0)
        t1 = cutlass.min(hi - at, nt)
        start = t0 * TILE
        end = cutlass.min(t1 * TILE, seq_len)
        n_tiles = cutlass.max((end - start + TILE - 1) // TILE, 0)
        return b, seq_len, nt, start, end, n_tiles, t0 + (nt - t1)

    @cute.jit
    def _cta_of(self, c, t):
        """The CTA whose run holds line position ``t``."""
        return ((t + 1) * c.ctas - 1) // c.total

    # -- roles --------------------------------------------------------------------------------

    @cute.jit
    def _produce_segments(
        self, tma_kv_atom, tma_kv, tma_q_atom, tma_q, s_kv, s_q, kv_pipe, q_pipe, m_bt, m_seq,
        line, lo, hi, rows_per_req, row_blocks, page_size,
    ):  # fmt: skip
        """The producer warp: per segment its query block (a stage of its own), then its
        tiles; the next segment's go out as soon as the ring and a query stage are free."""
        u0, at, n_segs = line
        boxes = self._kv_boxes(tma_kv_atom, tma_kv, s_kv)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 2)
        for k in cutlass.range(n_segs, unroll=1):
            u = u0 + k
            b, _, nt, start, end, n_tiles, _ = self._segment(m_seq, u, at, lo, hi, row_blocks)
            q_pipe.producer_acquire(q_state)
            self._load_query(tma_q_atom, tma_q, s_q, q_pipe.producer_get_barrier(q_state), b,
                             rows_per_req, (u % row_blocks) * self.rows, q_state.index,
                             arm=False)  # fmt: skip
            q_state.advance()
            state = self._produce_tiles(tma_kv_atom, boxes, kv_pipe, state, m_bt, b, start, end,
                                        n_tiles, page_size)  # fmt: skip
            at = at + nt

    @cute.jit
    def _consume_segments(
        self, c, s_q, kv_pipe, q_pipe, m_seq, m_out, m_lse, m_part_o, m_part_lse, m_count, line,
        rows_per_req, row_blocks, flag, run,
    ):  # fmt: skip
        """The consumer warp group: per segment both products and the softmax, then the
        rows: final for a whole request, else a part (merged by the request's last part)."""
        u0, at, n_segs = line
        c.flag = flag
        c.cta, c.ctas, c.total, c.lo, c.hi = run
        r_sb = c.mma_s.make_fragment_B(c.thr_s.partition_B(s_q))  # (MMA, 1, 36, query stage)
        acc_o, m_i, l_i = self._fresh_rows(c)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 2)
        for k in cutlass.range(n_segs, unroll=1):
            u = u0 + k
            b, seq_len, nt, start, end, n_tiles, cut = self._segment(
                m_seq, u, at, c.lo, c.hi, row_blocks
            )
            row0 = (u % row_blocks) * self.rows
            self._reset_rows(acc_o, m_i, l_i)
            q_pipe.consumer_wait(q_state)
            state = self._consume_tiles(
                c, kv_pipe, state, r_sb[None, None, None, q_state.index], acc_o, m_i, l_i, row0,
                start, end, seq_len, n_tiles,
            )  # fmt: skip
            q_pipe.consumer_release(q_state)
            q_state.advance()
            self._row_totals(c, m_i, l_i)
            base_row = b * rows_per_req + row0
            if cut == 0:
                self._write_rows(c, acc_o, m_out, m_lse, base_row, 1, 0, rows_per_req, row0,
                                 True)  # fmt: skip
            else:
                slot = 2 * c.cta
                if k > 0:
                    slot = slot + 1
                self._finish_part(c, acc_o, m_part_o, m_part_lse, m_out, m_lse, m_count, u, at,
                                  nt, slot, base_row, rows_per_req, row0)  # fmt: skip
            at = at + nt

    # -- parts of a request -------------------------------------------------------------------

    @cute.jit
    def _finish_part(
        self, c, acc_o, m_part_o, m_part_lse, m_out, m_lse, m_count, u, at, nt, slot, base_row,
        rows_per_req, row0,
    ):  # fmt: skip
        """This CTA's part of unit ``u`` (in ``acc_o``, with ``s_max`` / ``s_sum``).

        Where the unit has two parts and the other is already written (the common case: a run
        that begins inside a request is done with it long before the previous run reaches
        it), merge at once: the other part from L2, this one from registers, nothing written
        or counted. Otherwise write the part to ``slot`` and count it; the last part merges
        them all from L2. Both ways give the same bits (two parts fold symmetrically), and the
        count is left at zero for the next launch.

        The count is read with an acquire load, and the other threads read the parts after
        the barrier that follows it (CUTLASS's semaphore wait does the same). The
        acquire-release add of 0 it replaces, a GPU-scope fence (``MEMBAR``) and an atomic,
        took 1.9 / 2.5 us (median, 32 / 16 rows) on the H200 while the other SMs stream
        tiles; the load takes 0.4 / 0.3 us.
        """
        first = self._cta_of(c, at)
        parts = self._cta_of(c, at + nt - 1) - first + 1
        if c.tidx == 0:
            c.flag[0] = load_acquire(m_count.iterator + u)
        cute.arch.barrier(barrier_id=3, number_of_threads=self.consumer_threads)
        slots = self.rows // 4
        lse = cute.make_rmem_tensor((slots,), Float32)  # base 2, per own accumulator column
        self._own_part(c, acc_o, lse)
        if parts == 2 and c.flag[0] == 1:
            other = first
            if c.cta == first:
                other = first + 1
            self._fold_part(c, acc_o, lse, m_part_o, m_part_lse, self._part_slot(c, other, first,
                                                                               at))  # fmt: skip
            self._store_merged(c, acc_o, lse, m_out, m_lse, base_row, rows_per_req, row0)
            if c.tidx == 0:
                m_count[u] = 0
        else:
            self._write_part(c, acc_o, lse, m_part_o, m_part_lse, slot)
            # every thread's stores of the part precede thread 0's release (bar.sync, then a
            # cumulative GPU-scope fence), as in CUTLASS's split-K semaphore
            cute.arch.barrier(barrier_id=3, number_of_threads=self.consumer_threads)
            if c.tidx == 0:
                cute.arch.fence_acq_rel_gpu()
                c.flag[0] = count_parts(m_count.iterator + u, 1)
            cute.arch.barrier(barrier_id=3, number_of_threads=self.consumer_threads)
            if c.flag[0] == parts - 1:
                # fold in CTA order, whichever CTA merges (a thread reads back the elements
                # of its own part it wrote itself)
                lse.fill(_NEG_INF)
                acc_o.fill(0.0)
                for part in cutlass.range(first, first + parts, unroll=1):
                    self._fold_part(c, acc_o, lse, m_part_o, m_part_lse,
                                    self._part_slot(c, part, first, at))  # fmt: skip
                self._store_merged(c, acc_o, lse, m_out, m_lse, base_row, rows_per_req, row0)
                if c.tidx == 0:
                    m_count[u] = 0

    @cute.jit
    def _part_slot(self, c, part, first, at):
        """The slot CTA ``part`` wrote its part of the unit at line position ``at`` to: the
        first of its two, unless the unit began inside the run of its first CTA (``first``),
        which then holds it as its last segment."""
        slot = 2 * part
        if part == first and first * c.total // c.ctas < at:
            slot = slot + 1
        return slot

    @cute.jit
    def _own_part(self, c, acc_o, lse):
        """This CTA's part as a merge starts from it: ``acc_o`` normalised, base-2 LSEs."""
        slots = self.rows // 4
        inv = cute.make_rmem_tensor((slots,), Float32)
        for j in cutlass.range_constexpr(slots):
            total = c.s_sum[accumulator_column(j, c.lane % 4)]
            lse[j] = Float32(_NEG_INF)
            inv[j] = Float32(0.0)
            if total > 0.0:
                lse[j] = c.s_max[accumulator_column(j, c.lane % 4)] + cute.math.log2(total)
                inv[j] = 1.0 / total  # as _write_rows computes it: the same bits either way
        for i in cutlass.range_constexpr(cute.size(acc_o)):
            acc_o[i] = acc_o[i] * inv[accumulator_slot(i, self.rows)]

    @cute.jit
    def _part_vectors(self, c, m_part_o, slot):
        """This thread's view of part slot ``slot``: ``(4, rows)`` floats, vector ``v`` holding
        its accumulator elements ``4 v .. 4 v + 3``.

        A part is scratch that only this kernel reads back, and every CTA's consumer thread
        ``t`` holds the same output elements, so a slot is laid out in the threads' order:
        vector ``v`` of thread ``t`` at float ``(v * 128 + t) * 4``. Each warp then writes or
        reads 512 contiguous bytes per 16-byte access. Laid out as output rows, a part took
        four times the store instructions (each warp's touching four rows), and writing one
        took 11 us (median; up to 51) on the H200 at 32 rows while the other SMs stream
        tiles; this way 5.8 us (up to 21).
        """
        rows = self.rows
        base = (m_part_o.iterator + (slot * rows * D_LATENT + c.tidx * 4)).toint()
        ptr = cute.make_ptr(Float32, base, cute.AddressSpace.gmem, assumed_align=16)
        return cute.make_tensor(ptr, cute.make_layout((4, rows), stride=(1, 4 * 128)))

    @cute.jit
    def _write_part(self, c, acc_o, lse, m_part_o, m_part_lse, slot):
        """This CTA's part (``acc_o`` normalised by ``_own_part``, ``lse`` base 2) into
        ``slot``: the elements in the threads' order, the LSEs by row."""
        rows = self.rows
        g = self._part_vectors(c, m_part_o, slot)
        own = cute.make_tensor(acc_o.iterator, cute.make_layout((4, rows), stride=(1, 4)))
        for v in cutlass.range_constexpr(rows):
            cute.autovec_copy(own[None, v], g[None, v])
        if c.warp_in_wg == 0 and c.lane < 4:
            for j in cutlass.range_constexpr(rows // 4):
                m_part_lse[slot * rows + accumulator_column(j, c.lane)] = lse[j]

    @cute.jit
    def _fold_part(self, c, acc_o, lse, m_part_o, m_part_lse, slot):
        """Fold the part in ``slot`` into the merge (``acc_o`` normalised, ``lse`` base 2):
        each side weighted by its share of the two LSEs' sum."""
        slots = self.rows // 4
        keep = cute.make_rmem_tensor((slots,), Float32)
        take = cute.make_rmem_tensor((slots,), Float32)
        for j in cutlass.range_constexpr(slots):
            theirs = m_part_lse[slot * self.rows + accumulator_column(j, c.lane % 4)]
            both = cute.arch.fmax(lse[j], theirs)
            keep[j] = Float32(0.0)
            take[j] = Float32(0.0)
            if both != _NEG_INF:
                a = Float32(cute.math.exp2(lse[j] - both, fastmath=True))
                w = Float32(cute.math.exp2(theirs - both, fastmath=True))
                keep[j] = a / (a + w)
                take[j] = w / (a + w)
                lse[j] = both + cute.math.log2(a + w)
        g = self._part_vectors(c, m_part_o, slot)
        part = cute.make_rmem_tensor((4,), Float32)
        for v in cutlass.range_constexpr(self.rows):
            cute.autovec_copy(g[None, v], part)
            for e in cutlass.range_constexpr(4):
                i = 4 * v + e
                j = accumulator_slot(i, self.rows)
                acc_o[i] = acc_o[i] * keep[j] + part[e] * take[j]

    @cute.jit
    def _store_merged(self, c, acc_o, lse, m_out, m_lse, base_row, rows_per_req, row0):
        """The merged rows as the final output (and natural-log LSEs when asked for)."""
        for i in cutlass.range_constexpr(cute.size(acc_o)):
            d, n = c.coords_o[i]
            if row0 + n < rows_per_req:
                m_out[base_row + n, d] = acc_o[i].to(BFloat16)
        if cutlass.const_expr(self.write_lse):
            if c.warp_in_wg == 0 and c.lane < 4:
                for j in cutlass.range_constexpr(self.rows // 4):
                    n = accumulator_column(j, c.lane)
                    if row0 + n < rows_per_req:
                        m_lse[base_row + n] = lse[j] * math.log(2.0)


# -- torch entry point ------------------------------------------------------------------------

_COUNTS: dict[Any, Any] = {}


def part_counts(units: int, device: Any) -> Any:
    """The per-unit counts of finished parts: zeroed when made and left at zero by every
    launch (a unit's last part resets its count).

    One buffer per device, so persistent launches on one device must not overlap in time (the
    engine runs its forward passes on one stream). It is made, or grown, outside any CUDA
    graph capture: a capture would only record the zeroing, leaving the buffer garbage until
    the graph first replays; a call before capturing (the warm-up every captured kernel
    needs to compile) makes it.
    """
    import torch

    counts = _COUNTS.get(device)
    if counts is None or counts.numel() < units:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the persistent MLA decode's part counts are made outside a CUDA "
                               "graph capture: run the same batch once before capturing it")  # fmt: skip
        counts = _COUNTS[device] = torch.zeros(max(units, 4096), dtype=torch.int32,
                                               device=device)  # fmt: skip
    return counts
