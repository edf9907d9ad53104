"""Absorbed-MLA decode over an FP8 (e4m3) cache for Hopper, 64 query rows a CTA, widened in
the consumers' registers.

The 16/32-row register kernel (``cute_decode_fp8_regs.py``) gives each consumer group whole
tiles and all 512 output dims; at 64 rows its output would need 256 registers a thread. Here
the two groups share every tile instead:

* the groups take turns *scoring* tiles (``s^T = K q^T``, 36 ``wgmma.64x64x16`` with K widened
  from the slot into registers, as in the 32-row kernel): group ``g`` scores tiles ``g``,
  ``g + 2``, ... and runs the tile's softmax;
* the scorer publishes the tile's ``p^T`` (f16, one buffer per group), the rows' rescale
  factors and whether any row's max moved, through shared memory and named barrier
  ``_READY + g`` (its 128 threads arrive, the other group's 128 wait);
* both groups then multiply the tile's values, each over its *half of the output dims*
  (``o^T[256, 64] += V^T p^T``, 16 ``wgmma.64x64x16`` from 8-byte runs of the slot,
  ``fp8_regs_layout.value_load_half``): 128 accumulator registers a thread, the 32-row
  kernel's count.

The running max is one chain through the CTA's tiles, held in shared memory: the scorer of
tile ``t`` waits for tile ``t - 1``'s publication before its softmax (its scores, issued
before that wait, overlap the other group's softmax), and keeps each row's max while no score
passes it by more than ``max_slack`` (one ``bar.red.or`` vote, as in the 32-row kernel); only
then are the maxima exchanged and the outputs of both groups rescaled. A group runs, per
tile of its own: scores(t), [wait for t - 1], values(t - 1), softmax(t) and publish,
values(t). Multiplying the other group's tile before its own softmax frees that tile's slot
a softmax earlier: with three slots the loads have little lead, and this order was 4.5 %
faster than values(t - 1) after the softmax (H100, from HBM; the same from L2). It also
makes the buffers safe without a barrier of their own: the other group reads this group's
``p^T`` and factors of tile ``t - 2`` before it publishes ``t - 1``, which this group waits
for before writing tile ``t``'s. Each group issues 34 wgmmas per tile. A slot is emptied by
all eight consumer warps (each reads the values; the scorer also the keys).

Shared memory: the query (72 KiB), two ``p^T`` (16 KiB) and three FP8 slots (120 KiB, a
fourth does not fit). At the end each group normalises its own dims by both groups' row
sums and stores them (the final rows gathered in the spent query block and stored whole,
or a split's fp32 partial).

Sized from the wgmma rates measured on Hopper (docs/mla-experiments.md): 68 wgmmas a tile at ~38
cycles each when fed this way, ~160-190 us of tensor work at 128 heads against the 247-281 us
target. First measured on an H100 (batch 128 x 4096, per-token scales): 372 us at 128 heads
(x0.942 the pairs kernel's time; 334 us with every load an L2 hit) and 219 us at 64 heads
(x1.083); with no slack (the maxima exchanged every tile) x1.33-1.38 slower, which points
at the chain between the groups, not the tensor core, as what sets the pace. Since the
order above (and fewer spills: 100 bytes), 324 us at 128 heads and 172 us at 64 (H100).
Needs ``nvidia-cutlass-dsl`` (4.3) and an SM90 GPU; the launch wrapper is
``cute_decode.mla_decode`` (plan layout ``"regs"``, ``rows: 64``).
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import BFloat16, Float16, Float32, Int32, Uint8, Uint32
from cutlass.cute.nvgpu import warpgroup

import tokenspeed.mla.fp8_regs_layout as lay
from tokenspeed.kernels.cute_ops.common import (
    accumulator_column,
    accumulator_slot,
    barrier_or,
    merge_row_max,
    staged_rows,
    store_staged_rows,
    vector_at,
)

from .cute_decode import D_LATENT, TILE
from .cute_decode_fp8_regs import (
    MlaDecodeFp8RegsSm90,
    mask_value_runs,
    shared_struct,
    widen_value_runs,
)

_NEG_INF = -math.inf
_HALF = D_LATENT // 2  # o^T rows (latent dims) per consumer group
_VALUE_RUN = 8  # bytes of one shared load of the values: a group's half of a 16-byte run
_SCORE_RUN = 16
_VALUE_BLOCKS = TILE // 16
# named barriers: 1 + g within consumer group g, 3 across both groups, _READY + g: group g's
# tile published (arrive by g, sync by the other)
_BOTH_GROUPS = 3
_READY = 4


class MlaDecodeFp8Regs64Sm90(MlaDecodeFp8RegsSm90):
    """One compiled variant: page copy size, FP8 slots (2-3), scale kind and max slack."""

    slot_readers = 8  # both groups read every tile's values
    allowed_rows = (64,)

    def __init__(
        self, page_block: int, fp8_stages: int, split: bool, write_lse: bool, per_token: bool,
        ablation: str = "", max_slack: int = 4,
    ) -> None:  # fmt: skip
        super().__init__(64, page_block, fp8_stages, split, write_lse, per_token, ablation,
                         max_slack)  # fmt: skip
        if fp8_stages > 3:
            raise ValueError(f"fp8_stages={fp8_stages}: 64 rows leave room for 3 FP8 slots")
        self.score_buffers = 2
        self.value_buffers = 2

    def _shared_storage(self, q_layout, p_layout, fp8_layout):
        """The parent's, with the running max shared by both groups, each group's published
        rescale factors and flag, and no per-group max."""
        rows, mem, align = self.rows, cute.struct.MemRange, cute.struct.Align
        return shared_struct({
            "fp8_full_empty": mem[cutlass.Int64, self.fp8_stages * 2],
            "red": mem[Float32, 4 * rows * 2 * 2],  # (row, warp, group, parity)
            "row_max": mem[Float32, rows],  # the running max after the last published tile
            "alpha": mem[Float32, rows * 2],  # (row, scoring group)
            "flag": mem[Int32, 2],  # the scoring group's tile moved a max
            "row_sum": mem[Float32, rows * 2],  # (row, group)
            "s_q": align[mem[Float16, cute.cosize(q_layout)], 1024],
            "s_p": align[mem[Float16, cute.cosize(p_layout)], 1024],
            "s_fp8": align[mem[Uint8, cute.cosize(fp8_layout)], 128],
            "slot_scale": align[mem[Float32, TILE * self.fp8_stages], 16],
        })  # fmt: skip

    def _slot_state(self, tile):
        """The ring's consumer state of the split's tile ``tile`` (slots in turn)."""
        stages = self.fp8_stages
        return pipeline.PipelineState(
            stages, Int32(tile), Int32(tile % stages), Int32((tile // stages) % 2)
        )

    @cute.jit
    def _consume(
        self, mma_s, mma_o, s_q, s_p, s_fp8, slot_scale, storage, fp8_pipe, m_scale,
        m_out, m_lse, m_part_o, m_part_lse, scale_log2, q_len, num_heads, num_splits, b, split,
        rows_per_req, row0, start, end, seq_len, n_tiles, tidx, warp,
    ):  # fmt: skip
        """One consumer group: the tiles it scores and both groups' values over its half of
        the dims (module docstring), then its half of the output."""
        wg = warp // 4
        w = warp % 4
        lane = cute.arch.lane_idx()
        wg_tidx = tidx % 128
        rows = self.rows
        slots = rows // 4
        red = storage.red.get_tensor(cute.make_layout((rows, 4, 2, 2)))
        s_m = storage.row_max.get_tensor(cute.make_layout((rows,)))
        s_alpha = storage.alpha.get_tensor(cute.make_layout((rows, 2)))
        s_flag = storage.flag.get_tensor(cute.make_layout((2,)))
        s_sum = storage.row_sum.get_tensor(cute.make_layout((rows, 2)))
        scale_log2, out_scale = self._softmax_scales(scale_log2, m_scale)
        thr_s, r_sb, acc_s, coords_s, a_s = self._score_operands(mma_s, s_q, wg_tidx)
        thr_o, acc_o, coords_o, a_o = self._value_operands(mma_o, wg_tidx, _HALF)
        # p^T of this group's tiles and of the other's: (MMA, 1, 4) each
        r_ob_mine = mma_o.make_fragment_B(thr_o.partition_B(s_p[None, None, wg]))
        r_ob_other = mma_o.make_fragment_B(thr_o.partition_B(s_p[None, None, 1 - wg]))
        t_sp = self._p_destination(thr_s, s_p, wg)
        r_p = cute.make_rmem_tensor_like(acc_s, Float16)
        runs = [cute.make_rmem_tensor((_SCORE_RUN,), Uint8) for _ in range(2)]
        vruns = [cute.make_rmem_tensor((_VALUE_RUN,), Uint8) for _ in range(4)]
        tok_scale = cute.make_rmem_tensor((2,), Float32)
        m_use = cute.make_rmem_tensor((slots,), Float32)

        acc_o.fill(0.0)
        l_i = cute.make_rmem_tensor((slots,), Float32)
        l_i.fill(0.0)
        if tidx < rows:
            s_m[tidx] = Float32(_NEG_INF)
        if tidx < 2:
            s_flag[tidx] = Int32(0)
        cute.arch.barrier(barrier_id=_BOTH_GROUPS, number_of_threads=256)
        my_tokens = (lay.tile_token(16 * w + lane // 4), lay.tile_token(16 * w + lane // 4 + 8))
        first_t = seq_len - q_len  # kv position of query token 0
        n_mine = (n_tiles - wg + 1) // 2
        for i in cutlass.range(n_mine + 1, unroll=1):
            t = 2 * i + wg  # this group's tile; t - 1 is the other group's
            flag_prev = Int32(0)
            if t < n_tiles:
                scored = self._slot_state(t)
                fp8_pipe.consumer_wait(scored)
                keys = cute.local_tile(s_fp8, (lay.SLOT_BYTES,), (scored.index,))
                self._token_scales(tok_scale, slot_scale, my_tokens, t * TILE + start, end,
                                   scored.index)  # fmt: skip
                self._scores(mma_s, acc_s, r_sb, keys, a_s, runs, w, lane, None, scored)
                self._scale_and_mask(acc_s, coords_s, tok_scale, scale_log2, t * TILE + start,
                                     end, first_t, row0, num_heads)  # fmt: skip
            if t >= 1 and t - 1 < n_tiles:  # tile t - 1 published: its max is the one to start from
                cute.arch.barrier(barrier_id=_READY + 1 - wg, number_of_threads=256)
                flag_prev = s_flag[1 - wg]
                if flag_prev != 0:
                    for j in cutlass.range_constexpr(slots):
                        l_i[j] = l_i[j] * s_alpha[accumulator_column(j, lane % 4), 1 - wg]
                before = self._slot_state(t - 1)
                fp8_pipe.consumer_wait(before)  # complete already: the scorer waited for it
                values = cute.local_tile(s_fp8, (lay.SLOT_BYTES,), (before.index,))
                if flag_prev != 0:
                    self._rescale(acc_o, s_alpha, 1 - wg, lane)
                self._values_half(mma_o, acc_o, r_ob_other, values, a_o, vruns, w, lane, wg,
                                  (t - 1) * TILE + start, end, fp8_pipe, before)  # fmt: skip
            if t < n_tiles:
                # this group's previous p^T and factors were read before tile t - 1 was
                # published (module docstring), so the softmax may overwrite them
                self._softmax(acc_s, l_i, m_use, r_p, t_sp, tok_scale, red, s_m, s_alpha, s_flag,
                              w, wg, lane, wg_tidx, i % 2, self._slot_state(t))  # fmt: skip
                own = self._slot_state(t)
                own_values = cute.local_tile(s_fp8, (lay.SLOT_BYTES,), (own.index,))
                if s_flag[wg] != 0:
                    self._rescale(acc_o, s_alpha, wg, lane)
                self._values_half(mma_o, acc_o, r_ob_mine, own_values, a_o, vruns, w, lane, wg,
                                  t * TILE + start, end, fp8_pipe, own)  # fmt: skip

        self._store(acc_o, coords_o, l_i, red, s_q, s_m, s_sum, m_out, m_lse, m_part_o,
                    m_part_lse, out_scale, b * rows_per_req + row0, num_splits, split,
                    rows_per_req, row0, tidx, w, wg, lane)  # fmt: skip

    @cute.jit
    def _softmax(self, acc_s, l_i, m_use, r_p, t_sp, tok_scale, red, s_m, s_alpha, s_flag, w, wg,
                 lane, wg_tidx, parity, state):  # fmt: skip
        """The scored tile's online-softmax step, then its publication: each row's max is
        kept unless a score passes it by more than ``max_slack`` (one vote for the group);
        otherwise the maxima are exchanged (``merge_row_max``) and the new max and the
        factors go to shared memory. ``p^T`` (times the token's scale, in f16) is written
        for both groups' values, this group's row sums grow, and ``_READY + wg`` is
        arrived at once all of it is in place (the other group multiplies the tile's values
        next, so it needs ``p^T`` as soon as the max). ``state`` is the tile's slot state,
        unused here: ``benchmarks/mla/trace_regs64.py`` stamps by it."""
        slots = self.rows // 4
        m_i = cute.make_rmem_tensor((slots,), Float32)
        tile_max = self._tile_max(acc_s)
        over = Int32(0)
        for j in cutlass.range_constexpr(slots):  # -inf + slack stays -inf: the first tile
            m_i[j] = s_m[accumulator_column(j, lane % 4)]
            over = over | Int32(cutlass.select_(tile_max[j] > m_i[j] + self.max_slack, 1, 0))
            m_use[j] = cutlass.select_(m_i[j] == _NEG_INF, Float32(0.0), m_i[j])
        # every read of the shared max is before this barrier, every write after it
        moved = barrier_or(over, 1 + wg, 128)
        if moved != 0:
            alpha, m_new = merge_row_max(tile_max, m_i, l_i, red, (wg, parity), w, lane, 1 + wg)
            for j in cutlass.range_constexpr(slots):
                m_use[j] = m_new[j]
            if w == 0 and lane < 4:
                for j in cutlass.range_constexpr(slots):
                    n = accumulator_column(j, lane)
                    s_m[n] = m_i[j]
                    s_alpha[n, wg] = alpha[j]
        if wg_tidx == 0:
            s_flag[wg] = moved
        self._probabilities(acc_s, m_use, l_i, r_p, tok_scale, t_sp)
        cute.arch.barrier(barrier_id=1 + wg, number_of_threads=128)
        cute.arch.barrier_arrive(barrier_id=_READY + wg, number_of_threads=256)

    @cute.jit
    def _rescale(self, acc_o, s_alpha, scorer, lane):
        """This group's output times the factors the tile scored by group ``scorer``
        published (its rows' old max over the new)."""
        slots = self.rows // 4
        alpha = cute.make_rmem_tensor((slots,), Float32)
        for j in cutlass.range_constexpr(slots):
            alpha[j] = s_alpha[accumulator_column(j, lane % 4), scorer]
        for k in cutlass.range_constexpr(cute.size(acc_o)):
            acc_o[k] = acc_o[k] * alpha[accumulator_slot(k, self.rows)]

    @cute.jit
    def _values_half(self, mma_o, acc_o, r_ob, kv, a_o, vruns, w, lane, half, tile_start, end,
                     fp8_pipe, state):  # fmt: skip
        """``o^T += V^T p^T`` over this group's 256 dims of the tile in ``kv``: per k-block of
        16 tokens, four 8-byte runs (zeroed past the split's end, where ``p`` is 0 but a NaN
        byte would still reach the sum), paired by byte permutes and widened into one of two
        register operands, then its four M tiles issued. The group's share of the slot is
        released once its last runs are in registers."""
        vwords = [cute.recast_tensor(r, Uint32) for r in vruns]
        a_words = [cute.recast_tensor(a, Uint32) for a in a_o]
        for c in cutlass.range_constexpr(_VALUE_BLOCKS):
            tokens, _ = lay.value_load_half(w, lane, c, half)
            for s in cutlass.range_constexpr(4):
                at = (lay.value_offset(w, lane, c, s, half),)
                cute.autovec_copy(vector_at(kv, at, _VALUE_RUN), vruns[s])
            mask_value_runs(vwords, tokens, tile_start, end)
            if cutlass.const_expr(c >= len(a_o)):
                warpgroup.wait_group(len(a_o) - 1)
            widen_value_runs(vwords, a_words[c % len(a_o)])
            if cutlass.const_expr(c == _VALUE_BLOCKS - 1):
                fp8_pipe.consumer_release(state)
            warpgroup.fence()
            cute.gemm(mma_o, acc_o, a_o[c % len(a_o)][None, None, 0], r_ob[None, None, c], acc_o)
            warpgroup.commit_group()
        warpgroup.wait_group(0)

    @cute.jit
    def _store(
        self, acc_o, coords_o, l_i, red, s_q, s_m, s_sum, m_out, m_lse, m_part_o, m_part_lse,
        out_scale, first_row, num_splits, split, rows_per_req, row0, tidx, w, wg, lane,
    ):  # fmt: skip
        """Both groups' row sums (each already relative to the final max: every group applied
        every tile's factors), then each group's dims normalised and stored: the final bf16
        rows (gathered in the spent query block and stored whole by both groups) and
        natural-log LSE, or a split's fp32 partial and base-2 LSE."""
        slots = self.rows // 4
        self._group_row_sums(l_i, red, s_sum, w, wg, lane)
        cute.arch.barrier(barrier_id=_BOTH_GROUPS, number_of_threads=256)
        inv = cute.make_rmem_tensor((slots,), Float32)
        for j in cutlass.range_constexpr(slots):
            n = accumulator_column(j, lane % 4)
            total = s_sum[n, 0] + s_sum[n, 1]
            inv[j] = Float32(0.0)
            if total > 0.0:
                inv[j] = out_scale / total
        final = cutlass.const_expr(not self.split)
        if cutlass.const_expr(final):
            staged = staged_rows(cute.recast_ptr(s_q.iterator, dtype=BFloat16), self.rows,
                                 D_LATENT)  # fmt: skip
        for k in cutlass.range_constexpr(cute.size(acc_o)):
            d, n = coords_o[k]
            value = acc_o[k] * inv[accumulator_slot(k, self.rows)]
            dim = lay.value_dim(d + _HALF * wg)
            if cutlass.const_expr(final):
                staged[n, dim] = value.to(BFloat16)
            elif row0 + n < rows_per_req:
                m_part_o[(first_row + n) * num_splits + split, dim] = value
        if cutlass.const_expr(final):
            cute.arch.barrier(barrier_id=_BOTH_GROUPS, number_of_threads=256)
            store_staged_rows(staged, m_out, first_row, rows_per_req - row0, tidx, 256)
        if tidx < self.rows:
            n = tidx
            if row0 + n < rows_per_req:
                total = s_sum[n, 0] + s_sum[n, 1]
                lse2 = Float32(_NEG_INF)
                if total > 0.0:
                    lse2 = s_m[n] + cute.math.log2(total)
                if cutlass.const_expr(not final):
                    m_part_lse[(first_row + n) * num_splits + split] = lse2
                elif cutlass.const_expr(self.write_lse):
                    m_lse[first_row + n] = lse2 * math.log(2.0)
