"""Absorbed-MLA decode over an FP8 (e4m3) cache for Hopper, widened in the consumers' registers.

An FP8 tile widened into a 16-bit copy in shared memory for wgmma to read (the tokens kernel of
the early sessions, removed in the thirty-ninth) costs per 64-token tile 36 KiB written by the
copy engine, 72 KiB written by converters and read again by the products: ~250 KiB of
shared-memory traffic, and a 16-bit ring that leaves room for one FP8 slot in flight. Here both
products take their A operand from registers (``s^T = K q^T`` and ``o^T = V^T p^T``, tokens on M
as in the bf16 kernel, f16 products): each consumer thread loads its share of the FP8 tile with
16-byte shared loads and widens it with one hardware conversion per pair of values straight into
the operand (``fp8_regs_layout.py`` places every value; the query is permuted to match and the
output un-permuted). Shared memory holds the query, ``p^T`` and ``fp8_stages`` FP8 slots (four);
a slot is released as soon as its values are in registers. A slot is 64 tokens x 640 bytes: five
128-byte-wide TMA boxes per page block with the 128-byte swizzle (the fifth half past the row,
zero-filled), so that with the tiles' token order every 16-byte load of both products is free of
bank conflicts (``fp8_regs_layout.slot_offset``; with the page block's rows copied whole, 576
bytes apart, the values' loads conflicted 2-way, 21 % of shared memory's wavefronts in excess
under Nsight Compute).

Warp roles (384 threads): two consumer warp groups take the split's tiles in turn (group
``g`` tiles ``g``, ``g + 2``, ...), each with its own softmax state, so one group's softmax
and loads overlap the other's products; at the end group 1 hands its rows to group 0 through
the spent ring, and group 0 merges and stores them. Warp 8 loads (``_load_slots``: the
tiles by TMA, the per-token scales by ``copy_page_scales``'s bulk copies), in a warp group of
its own so that ``setmaxnreg`` can move its registers to the consumers.

The scale is applied in float32 as in the other FP8 kernels: one per tensor folded into the
softmax scale and the output; one per token multiplying the token's scores and its
probabilities, bulk-copied with its tile into a slot beside it (read from global memory by
the consumers instead, two dependent loads a tile, the 16-row decode took 103 us, not 94).
Tokens past the split's end are zeroed before the values product (a NaN byte would otherwise
reach it) and masked out of the scores, their scales taken as 0.

H200 (batch 128 x 4096, page 64, q_len 1): 89.3-92.2 / 121.7-123.6 us at 16 / 32 heads with
per-token scales (~79 / ~60 % of the copy bandwidth), 88.4 / 118.9 us per-tensor, against ~120
/ ~140 us for that shared-memory widening in the same runs; with the page blocks' rows 576
bytes apart it took 94-96 / 125-129 us (docs/mla-experiments.md). At 32 rows the values product
widens one register operand at a time (its 128 accumulator registers leave no room for two) and
ptxas spills 64 bytes.

Needs ``nvidia-cutlass-dsl`` (4.3) and an SM90 GPU; bf16 query (read as 32-bit words), e4m3
cache, 16 or 32 rows per CTA. The launch wrapper is ``cute_decode.mla_decode`` (plan layout
``"regs"``).
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float16, Float32, Int32, Uint8, Uint32
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cutlass_dsl import dsl_user_op

import tokenspeed.mla.fp8_regs_layout as lay
from tokenspeed.kernels.cute_ops.common import (
    accumulator_column,
    accumulator_slot,
    barrier_or,
    column_sum,
    ptx_i32,
    staged_rows,
    store_staged_rows,
    vector_at,
)

from .cute_decode import D_LATENT, D_QK, TILE, KvRingProducer, running_max
from .fp8_widen import (
    Q_F16_SCALE,
    bf16x2_to_f16x2_scaled,
    copy_page_scales,
    e4m3x2_to_f16x2,
)

_NEG_INF = -math.inf
_RUN = 16  # bytes of one shared load: a run of 16 values of one token
_GROUPS = D_QK // lay.GROUP  # the scores' groups of four k-blocks
_VALUE_BLOCKS = TILE // 16  # the values product's k-blocks (16 tokens each)
# named barriers: 1 + g within consumer group g, 3 across both groups (0 is __syncthreads)
_BOTH_GROUPS = 3


@dsl_user_op
def byte_perm(a: Uint32, b: Uint32, selector: int, *, loc=None, ip=None) -> Uint32:
    """``prmt.b32``: four of the eight bytes of ``a`` (0-3) and ``b`` (4-7), as ``selector``'s
    nibbles name them, lowest first."""
    a = Uint32(a).ir_value(loc=loc, ip=ip)
    b = Uint32(b).ir_value(loc=loc, ip=ip)
    ptx = f"prmt.b32 $0, $1, $2, {selector:#x};"
    return Uint32(ptx_i32(ptx, "=r,r,r", [a, b], side_effects=False, loc=loc, ip=ip))


def shared_struct(fields: dict) -> type:
    """A ``cute.struct`` of ``fields`` (name to type, in order), built where a class body's
    annotations would be strings (this module's ``from __future__ import annotations``)
    that the struct cannot read."""
    storage = type("SharedStorage", (), {"__annotations__": dict(fields)})
    return cute.struct(storage)


@cute.jit
def mask_value_runs(vwords, tokens, tile_start, end):
    """A values k-block's four runs (``vwords``, of the tokens ``tokens``) zeroed past the
    split's end: ``p`` is 0 there, but a NaN byte would still reach the sum."""
    for s in cutlass.range_constexpr(4):
        live = tile_start + tokens[s] < end
        for u in cutlass.range_constexpr(cute.size(vwords[s])):
            vwords[s][u] = cutlass.select_(live, vwords[s][u], Uint32(0))


@cute.jit
def widen_value_runs(vwords, words):
    """A values k-block's four runs into its register operand's ``words``: each word's bytes
    paired across two tokens by byte permutes and widened to f16 pairs (``lay.value_word``
    places them)."""
    for u in cutlass.range_constexpr(cute.size(vwords[0])):
        for second in cutlass.range_constexpr(2):
            for high_pair in cutlass.range_constexpr(2):
                pair = byte_perm(
                    vwords[2 * second][u], vwords[2 * second + 1][u],
                    (lay.PAIR_LOW, lay.PAIR_HIGH)[high_pair],
                )  # fmt: skip
                for high in cutlass.range_constexpr(2):
                    words[lay.value_word(u, second, high_pair, high)] = e4m3x2_to_f16x2(
                        pair, high == 1
                    )


class MlaDecodeFp8RegsSm90(KvRingProducer):
    """One compiled variant: rows (16/32), page copy size, FP8 slots, scale kind, max slack."""

    loader_warp = 8
    threads = 384
    slot_readers = 4  # the warps of the one consumer group whose tile a slot holds
    allowed_rows = (16, 32)
    # setmaxnreg: the launch gives 64 K / 384 -> 168 registers a thread; the loader's group
    # gives back to 24 and the consumers take 240 (2 x 240 + 24 = 3 x 168)
    consumer_regs = 240
    loader_regs = 24

    def __init__(
        self, rows: int, page_block: int, fp8_stages: int, split: bool, write_lse: bool,
        per_token: bool, ablation: str = "", max_slack: int = 0,
    ) -> None:  # fmt: skip
        if rows not in self.allowed_rows:
            raise ValueError(f"rows={rows}: this FP8 register decode takes {self.allowed_rows}")
        if page_block not in (8, 16, 32, 64):
            raise ValueError(f"page_block={page_block} must be 8, 16, 32 or 64")
        if fp8_stages < 2:
            raise ValueError(f"fp8_stages={fp8_stages}: the two consumer groups need 2 or more")
        # benchmark-only: "l2_loads" copies every tile from the cache's first boxes (L2 hits)
        if ablation not in ("", "l2_loads"):
            raise ValueError(f"unknown ablation {ablation!r}")
        self.rows = rows
        self.page_block = page_block
        self.copies_per_tile = TILE // page_block
        self.fp8_stages = fp8_stages
        self.split = split
        self.write_lse = write_lse
        self.per_token = per_token
        self.ablation = ablation
        if not 0 <= max_slack <= 8:
            raise ValueError(f"max_slack={max_slack}: 0 to 8 (log2 units)")
        self.max_slack = max_slack  # see _lazy_max
        self.mma_dtype = Float16
        # register operands widened ahead: two of each (one widened while the other's products
        # run), or at 32 rows one for the values (its 128 accumulator registers leave no room)
        self.score_buffers = 2
        self.value_buffers = 2 if rows == 16 else 1

    # -- host side ----------------------------------------------------------------------------

    @cute.jit
    def __call__(
        self,
        m_q: cute.Tensor,  # [rows_total, 288] int32: the bf16 query's pairs of values
        m_kv: cute.Tensor,  # [pages * page_size, 576] uint8 (the e4m3 bytes)
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
        f16, k_major = Float16, warpgroup.OperandMajorMode.K
        # s^T[64 tok, rows] = K[64 tok, 576] q^T and o^T[512, rows] += V^T[512, 64 tok] p^T:
        # A (the cache) from registers, B (query, p^T) K-major in shared memory
        mma_s, mma_o = (
            sm90_utils.make_trivial_tiled_mma(
                f16,
                f16,
                k_major,
                k_major,
                Float32,
                (1, 1, 1),
                tiler_mn=(TILE, self.rows),
                a_source=warpgroup.OperandSource.RMEM,
            )  # fmt: skip
            for _ in range(2)
        )
        row_major = utils.LayoutEnum.ROW_MAJOR
        q_layout = sm90_utils.make_smem_layout_b(row_major, (TILE, self.rows, D_QK), f16, 1)
        # one p^T per consumer group
        p_layout = sm90_utils.make_smem_layout_b(row_major, (TILE, self.rows, TILE), f16, 2)
        # slots of 64 tokens x 640 bytes: 128-byte-wide TMA boxes with the 128-byte swizzle
        # (lay.slot_offset), the fifth box half past the row and zero-filled
        swizzle_atom = cute.make_composed_layout(
            cute.make_swizzle(3, 4, 3), 0, cute.make_layout((8, 128), stride=(128, 1))
        )
        fp8_layout = cute.tile_to_shape(swizzle_atom, (TILE, lay.SLOT_COLS, self.fp8_stages),
                                        (0, 1, 2))  # fmt: skip
        slot = cute.slice_(fp8_layout, (None, None, 0))
        box_layout = cute.make_composed_layout(
            slot.inner, 0,
            cute.composition(slot.outer, cute.make_layout((self.page_block, lay.SLOT_COLS),
                                                          stride=(1, TILE))),
        )  # fmt: skip
        tma_atom, tma_kv = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), m_kv, box_layout,
            (self.page_block, lay.SLOT_COLS),
        )  # fmt: skip
        scale_atom = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), Float32,
                                         num_bits_per_copy=self.page_block * 32)  # fmt: skip
        self.shared_storage = self._shared_storage(q_layout, p_layout, fp8_layout)
        self.kernel(
            mma_s, mma_o, tma_atom, tma_kv, scale_atom, m_q, m_scale, q_layout, p_layout,
            fp8_layout, m_bt, m_seq, m_out, m_lse, m_part_o, m_part_lse,
            scale_log2, q_len, num_heads, num_splits, page_size,
        ).launch(
            grid=[row_blocks, num_splits, batch], block=[self.threads, 1, 1], stream=stream,
            min_blocks_per_mp=1,
        )  # fmt: skip

    def _shared_storage(self, q_layout, p_layout, fp8_layout):
        """The CTA's shared memory: the ring's barriers, the softmax's exchange, the query,
        one ``p^T`` per consumer group, the FP8 slots and their per-token scales."""
        rows, mem, align = self.rows, cute.struct.MemRange, cute.struct.Align
        return shared_struct({
            "fp8_full_empty": mem[cutlass.Int64, self.fp8_stages * 2],
            "red": mem[Float32, 4 * rows * 2 * 2],  # (row, warp, group, parity)
            "row_max": mem[Float32, rows * 2],  # (row, group)
            "row_sum": mem[Float32, rows * 2],
            "s_q": align[mem[Float16, cute.cosize(q_layout)], 1024],
            "s_p": align[mem[Float16, cute.cosize(p_layout)], 1024],
            "s_fp8": align[mem[Uint8, cute.cosize(fp8_layout)], 128],
            # per-token scales, bulk-copied beside each slot's tile (token, slot)
            "slot_scale": align[mem[Float32, TILE * self.fp8_stages], 16],
        })  # fmt: skip

    # -- device side --------------------------------------------------------------------------

    @cute.kernel
    def kernel(
        self,
        mma_s: cute.TiledMma,
        mma_o: cute.TiledMma,
        tma_atom: cute.CopyAtom,
        tma_kv: cute.Tensor,
        scale_atom: cute.CopyAtom,
        m_q: cute.Tensor,
        m_scale: cute.Tensor,
        q_layout: cute.ComposedLayout,
        p_layout: cute.ComposedLayout,
        fp8_layout: cute.ComposedLayout,
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
        seq_len, start, end, n_tiles = self._split_tiles(m_seq, b, split, num_splits)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        s_fp8_tma = storage.s_fp8.get_tensor(fp8_layout.outer, swizzle=fp8_layout.inner)
        # the consumers address the same bytes themselves (lay.slot_offset)
        s_fp8 = storage.s_fp8.get_tensor(cute.make_layout(cute.cosize(fp8_layout)))
        slot_scale = storage.slot_scale.get_tensor(cute.make_layout((TILE, self.fp8_stages)))
        # FP8 ring: bulk copies (the tile, and its scales) complete its full barriers; the
        # warps that read a slot's tile (``slot_readers``) empty it
        fp8_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.fp8_full_empty.data_ptr(),
            num_stages=self.fp8_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.slot_readers),
            tx_count=TILE * lay.SLOT_COLS + (TILE * 4 if self.per_token else 0),
            defer_sync=True,
        )
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        s_q = storage.s_q.get_tensor(q_layout.outer, swizzle=q_layout.inner)
        s_p = storage.s_p.get_tensor(p_layout.outer, swizzle=p_layout.inner)
        rows_per_req = q_len * num_heads
        row0 = rb * self.rows

        if warp >= self.loader_warp:
            cute.arch.warpgroup_reg_dealloc(self.loader_regs)
            if warp == self.loader_warp:
                self._load_slots(tma_atom, tma_kv, s_fp8_tma, fp8_pipe, m_bt, b, start, end,
                                 n_tiles, page_size, scale_atom, m_scale, slot_scale)  # fmt: skip
        else:
            cute.arch.warpgroup_reg_alloc(self.consumer_regs)
            self._query_to_smem(m_q, s_q[None, None, 0], b, rows_per_req, row0, tidx)
            cute.arch.barrier(barrier_id=_BOTH_GROUPS, number_of_threads=256)
            self._consume(
                mma_s, mma_o, s_q, s_p, s_fp8, slot_scale, storage, fp8_pipe, m_scale,
                m_out, m_lse, m_part_o, m_part_lse, scale_log2, q_len, num_heads, num_splits, b,
                split, rows_per_req, row0, start, end, seq_len, n_tiles, tidx, warp,
            )  # fmt: skip

    @cute.jit
    def _load_slots(self, tma_atom, tma_kv, s_fp8_tma, fp8_pipe, m_bt, b, start, end, n_tiles,
                    page_size, scale_atom, m_scale, slot_scale):  # fmt: skip
        """The loader warp: every tile of the split by TMA, five 128-byte-wide boxes per page
        block into the slot (a block wholly past the split's end points past the cache and
        is zero-filled), and with per-token scales each page block's scales beside it by a
        bulk copy (the ring's byte count includes both)."""
        s_boxes = cute.flat_divide(s_fp8_tma, (self.page_block, lay.SLOT_COLS))
        g_boxes = cute.local_tile(tma_kv, (self.page_block, lay.SLOT_COLS), (None, 0))
        t_kvs, t_kvg = cpasync.tma_partition(
            tma_atom, 0, cute.make_layout(1), cute.group_modes(s_boxes, 0, 2),
            cute.group_modes(g_boxes, 0, 2),
        )  # fmt: skip
        n_boxes = Int32(cute.size(g_boxes, mode=[2]))
        cpt = self.copies_per_tile
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                             self.fp8_stages)  # fmt: skip
        boxes = cute.make_rmem_tensor((cpt,), Int32)
        for tile in cutlass.range(n_tiles, unroll=1):
            if cutlass.const_expr(self.page_prefetch):  # the table read under the slot wait
                for c in cutlass.range_constexpr(cpt):
                    boxes[c] = self._page_box(m_bt, b, start + tile * TILE + c * self.page_block,
                                              end, page_size)  # fmt: skip
            fp8_pipe.producer_acquire(state)
            barrier = fp8_pipe.producer_get_barrier(state)
            # one block at a time (the loader's warp has 24 registers)
            for c in cutlass.range_constexpr(cpt):
                pos = start + tile * TILE + c * self.page_block
                box = boxes[c]
                if cutlass.const_expr(not self.page_prefetch):
                    box = self._page_box(m_bt, b, pos, end, page_size)
                if cutlass.const_expr(self.ablation == "l2_loads"):
                    box = Int32(c)  # benchmark-only: every tile from L2 (see MlaDecodeSm90)
                # a block wholly past the end points past the cache: TMA zero-fills it
                tma_box = box
                if pos >= end:
                    tma_box = n_boxes
                cute.copy(tma_atom, t_kvg[(None, tma_box)], t_kvs[(None, c, 0, state.index)],
                          tma_bar_ptr=barrier)  # fmt: skip
                if cutlass.const_expr(self.per_token):  # past the end: block 0's (unused)
                    copy_page_scales(scale_atom, m_scale, slot_scale, self.page_block, box, c,
                                     state.index, barrier)  # fmt: skip
            state.advance()

    @cute.jit
    def _page_box(self, m_bt, b, pos, end, page_size):
        """The cache's page block holding token ``pos`` of request ``b`` (0 past the split's
        end, where nothing of the table is read)."""
        box = Int32(0)
        if pos < end:
            page = m_bt[b, pos // page_size]
            box = (page * page_size + pos % page_size) // self.page_block
        return box

    @cute.jit
    def _query_to_smem(self, m_q, s_q, b, rows_per_req, row0, tidx):
        """The CTA's query rows into ``s_q`` by both consumer groups: f16 times
        ``Q_F16_SCALE``, each pair of dims at the position the scores' K order gives it
        (``lay.query_element``); rows past the request's are zeros."""
        pair = cute.make_rmem_tensor((2,), Float16)
        pair_word = cute.recast_tensor(pair, Uint32)
        words = D_QK // 2
        for k in cutlass.range_constexpr(self.rows * words // 256):
            index = k * 256 + tidx
            h = index // words
            p = index % words
            word = Uint32(0)
            if row0 + h < rows_per_req:
                word = Uint32(m_q[b * rows_per_req + row0 + h, p])
            pair_word[0] = bf16x2_to_f16x2_scaled(word)
            at = lay.query_element(p)
            cute.autovec_copy(pair, cute.local_tile(s_q[h, None], (2,), (at // 2,)))
        cute.arch.fence_proxy(
            cute.arch.ProxyKind.async_shared, space=cute.arch.SharedSpace.shared_cta
        )

    @cute.jit
    def _scores(self, mma_s, acc_s, r_sb, kv, a_s, runs, w, lane, vruns, state):
        """``s^T = K q^T`` over the tile in ``kv``: per group of 64 dims, two 16-byte runs
        widened into one of two register operands (the other group's products still in
        flight), then its four k-blocks issued. Before the wait that ends it, the values'
        first runs are loaded into ``vruns``, so the softmax hides their latency (x0.986 at
        16 and 32 heads against loading them after it). ``state`` is the slot's, unused
        here: ``benchmarks/mla/trace_regs.py`` stamps each tile's phases by its count."""
        run_words = [cute.recast_tensor(r, Uint32) for r in runs]
        a_words = [cute.recast_tensor(a, Uint32) for a in a_s]
        for g in cutlass.range_constexpr(_GROUPS):
            for second in cutlass.range_constexpr(2):  # lay.score_load's two runs
                at = (lay.score_offset(w, lane, g, second),)
                cute.autovec_copy(vector_at(kv, at, _RUN), runs[second])
            if cutlass.const_expr(g >= len(a_s)):  # the products that read this buffer are done
                warpgroup.wait_group(len(a_s) - 1)
            words = a_words[g % len(a_s)]
            for j in cutlass.range_constexpr(4):
                for second in cutlass.range_constexpr(2):
                    for high in cutlass.range_constexpr(2):
                        words[lay.score_word(j, second, high)] = e4m3x2_to_f16x2(
                            run_words[second][j], high == 1
                        )
            warpgroup.fence()
            for j in cutlass.range_constexpr(4):
                mma_s.set(warpgroup.Field.ACCUMULATE, g + j > 0)
                a = a_s[g % len(a_s)][None, None, j]
                cute.gemm(mma_s, acc_s, a, r_sb[None, None, 4 * g + j], acc_s)
            warpgroup.commit_group()
        # the values' first runs load under the last products and the softmax (none: the
        # 64-row kernel's next values product reads another tile)
        if cutlass.const_expr(vruns is not None):
            self._value_runs(kv, vruns, 0, w, lane)
        warpgroup.wait_group(0)

    @cute.jit
    def _value_runs(self, kv, vruns, c, w, lane):
        """The four 16-byte runs of values k-block ``c`` this thread widens."""
        for s in cutlass.range_constexpr(4):  # lay.value_load's runs
            at = (lay.value_offset(w, lane, c, s),)
            cute.autovec_copy(vector_at(kv, at, _RUN), vruns[s])

    @cute.jit
    def _values(self, mma_o, acc_o, r_ob, kv, a_o, vruns, w, lane, tile_start, end, fp8_pipe,
                state):  # fmt: skip
        """``o^T += V^T p^T`` over the tile in ``kv``: per k-block of 16 tokens, four 16-byte
        runs (zeroed past the split's end), paired by byte permutes and widened into one of
        two register operands, then its eight M tiles issued. The slot is released once the
        last runs are in registers; the products are waited for before it returns."""
        vwords = [cute.recast_tensor(r, Uint32) for r in vruns]
        a_words = [cute.recast_tensor(a, Uint32) for a in a_o]
        for c in cutlass.range_constexpr(_VALUE_BLOCKS):
            tokens, _ = lay.value_load(w, lane, c)
            if cutlass.const_expr(c > 0):  # k-block 0's were loaded under the softmax
                self._value_runs(kv, vruns, c, w, lane)
            mask_value_runs(vwords, tokens, tile_start, end)
            if cutlass.const_expr(c >= len(a_o)):
                warpgroup.wait_group(len(a_o) - 1)
            widen_value_runs(vwords, a_words[c % len(a_o)])
            if cutlass.const_expr(c == _VALUE_BLOCKS - 1):
                fp8_pipe.consumer_release(state)  # the tile's bytes are all in registers
            warpgroup.fence()
            cute.gemm(mma_o, acc_o, a_o[c % len(a_o)][None, None, 0], r_ob[None, None, c], acc_o)
            warpgroup.commit_group()
        warpgroup.wait_group(0)

    @cute.jit
    def _consume(
        self, mma_s, mma_o, s_q, s_p, s_fp8, slot_scale, storage, fp8_pipe, m_scale,
        m_out, m_lse, m_part_o, m_part_lse, scale_log2, q_len, num_heads, num_splits, b, split,
        rows_per_req, row0, start, end, seq_len, n_tiles, tidx, warp,
    ):  # fmt: skip
        """One consumer group: its tiles (every other one of the split), then the merge of both
        groups' rows and, in group 0, the output."""
        wg = warp // 4
        w = warp % 4
        lane = cute.arch.lane_idx()
        wg_tidx = tidx % 128
        rows = self.rows
        slots = rows // 4
        red = storage.red.get_tensor(cute.make_layout((rows, 4, 2, 2)))
        s_max = storage.row_max.get_tensor(cute.make_layout((rows, 2)))
        s_sum = storage.row_sum.get_tensor(cute.make_layout((rows, 2)))
        scale_log2, out_scale = self._softmax_scales(scale_log2, m_scale)
        thr_s, r_sb, acc_s, coords_s, a_s = self._score_operands(mma_s, s_q, wg_tidx)
        thr_o, acc_o, coords_o, a_o = self._value_operands(mma_o, wg_tidx, D_LATENT)
        r_ob = mma_o.make_fragment_B(thr_o.partition_B(s_p[None, None, wg]))  # (MMA, 1, 4)
        t_sp = self._p_destination(thr_s, s_p, wg)
        r_p = cute.make_rmem_tensor_like(acc_s, Float16)
        runs = [cute.make_rmem_tensor((_RUN,), Uint8) for _ in range(2)]
        vruns = [cute.make_rmem_tensor((_RUN,), Uint8) for _ in range(4)]

        acc_o.fill(0.0)
        m_i = cute.make_rmem_tensor((slots,), Float32)
        l_i = cute.make_rmem_tensor((slots,), Float32)
        m_i.fill(_NEG_INF)
        l_i.fill(0.0)
        # a thread's scores sit in two tokens of the tile: rows (i // 2) % 2 of its quad
        my_tokens = (lay.tile_token(16 * w + lane // 4), lay.tile_token(16 * w + lane // 4 + 8))
        first_t = seq_len - q_len  # kv position of query token 0
        state = pipeline.PipelineState(self.fp8_stages, Int32(wg), Int32(wg), Int32(0))
        for i in cutlass.range((n_tiles - wg + 1) // 2, unroll=1):
            tile = 2 * i + wg
            tile_start = start + tile * TILE
            tok_scale = cute.make_rmem_tensor((2,), Float32)
            fp8_pipe.consumer_wait(state)
            kv = cute.local_tile(s_fp8, (lay.SLOT_BYTES,), (state.index,))
            self._token_scales(tok_scale, slot_scale, my_tokens, tile_start, end, state.index)
            self._scores(mma_s, acc_s, r_sb, kv, a_s, runs, w, lane, vruns, state)
            self._scale_and_mask(acc_s, coords_s, tok_scale, scale_log2, tile_start, end,
                                 first_t, row0, num_heads)  # fmt: skip
            if cutlass.const_expr(self.max_slack):
                m_use = self._lazy_max(acc_s, acc_o, m_i, l_i, red, w, wg, lane, i % 2)
            else:
                alpha, m_use = running_max(acc_s, m_i, l_i, red, rows, w, wg, lane, i % 2)
            self._probabilities(acc_s, m_use, l_i, r_p, tok_scale, t_sp)
            cute.arch.barrier(barrier_id=1 + wg, number_of_threads=128)
            if cutlass.const_expr(not self.max_slack):
                for k in cutlass.range_constexpr(cute.size(acc_o)):
                    acc_o[k] = acc_o[k] * alpha[accumulator_slot(k, rows)]
            self._values(mma_o, acc_o, r_ob, kv, a_o, vruns, w, lane, tile_start, end, fp8_pipe,
                         state)  # fmt: skip
            state.advance()
            state.advance()

        # each group's row totals, then group 1's rows through the spent ring to group 0
        self._group_row_sums(l_i, red, s_sum, w, wg, lane)
        if w == 0 and lane < 4:
            for j in cutlass.range_constexpr(slots):
                s_max[accumulator_column(j, lane), wg] = m_i[j]
        cute.arch.barrier(barrier_id=_BOTH_GROUPS, number_of_threads=256)
        handover = cute.make_tensor(
            cute.recast_ptr(s_fp8.iterator, dtype=Float32),
            cute.make_layout((cute.size(acc_o), 128), stride=(128, 1)),
        )
        if wg == 1:
            for k in cutlass.range_constexpr(cute.size(acc_o)):
                handover[k, wg_tidx] = acc_o[k]
        cute.arch.barrier(barrier_id=_BOTH_GROUPS, number_of_threads=256)
        if wg == 0:
            self._merge_and_store(
                acc_o, handover, coords_o, s_q, s_max, s_sum, m_out, m_lse, m_part_o, m_part_lse,
                out_scale, b * rows_per_req + row0, num_splits, split, rows_per_req, row0,
                wg_tidx, lane,
            )  # fmt: skip

    @cute.jit
    def _token_scales(self, tok_scale, slot_scale, my_tokens, tile_start, end, index):
        """With per-token scales, those of the thread's two tokens of the tile in slot
        ``index`` (they came with it; 0 past the split's end)."""
        if cutlass.const_expr(self.per_token):
            for h in cutlass.range_constexpr(2):
                live = tile_start + my_tokens[h] < end
                tok_scale[h] = Float32(cutlass.select_(
                    live, slot_scale[my_tokens[h], index], Float32(0.0)))  # fmt: skip

    @cute.jit
    def _scale_and_mask(self, acc_s, coords_s, tok_scale, scale_log2, tile_start, end, first_t,
                        row0, num_heads):  # fmt: skip
        """The tile's scores into log2 units (times the token's scale) and masked: tokens past
        the split's end, and past a row's own query token in the causal query block."""
        row_scale = cute.make_rmem_tensor((2,), Float32)
        if cutlass.const_expr(self.per_token):
            for h in cutlass.range_constexpr(2):
                row_scale[h] = scale_log2 * tok_scale[h]
        for k in cutlass.range_constexpr(cute.size(acc_s)):
            if cutlass.const_expr(self.per_token):
                acc_s[k] = acc_s[k] * row_scale[(k // 2) % 2]
            else:
                acc_s[k] = acc_s[k] * scale_log2
        if tile_start + TILE > cutlass.min(end, first_t + 1):  # one branch per tile
            for k in cutlass.range_constexpr(cute.size(acc_s)):
                m, n = coords_s[k]
                pos = tile_start + lay.tile_token(m)
                if pos >= end or pos > first_t + (row0 + n) // num_heads:
                    acc_s[k] = Float32(_NEG_INF)

    def _softmax_scales(self, scale_log2, m_scale):
        """The scores' scale in log2 units and the output's: the query was scaled into f16's
        range, and a per-tensor cache scale folds into both (per-token ones come with the
        tiles)."""
        scale_log2 = scale_log2 * (1.0 / Q_F16_SCALE)
        out_scale = Float32(1.0)
        if cutlass.const_expr(not self.per_token):
            out_scale = m_scale[0]
            scale_log2 = scale_log2 * out_scale
        return scale_log2, out_scale

    def _score_operands(self, mma_s, s_q, wg_tidx):
        """A consumer thread's side of ``s^T = K q^T``: its slice, the query fragment
        ``(MMA, 1, 36)``, the accumulator and its (token, row) coordinates, and the
        ``score_buffers`` register operands K is widened into."""
        thr_s = mma_s.get_slice(wg_tidx)
        r_sb = mma_s.make_fragment_B(thr_s.partition_B(s_q[None, None, 0]))
        acc_s = cute.make_rmem_tensor(mma_s.partition_shape_C((TILE, self.rows)), Float32)
        coords_s = thr_s.partition_C(cute.make_identity_tensor((TILE, self.rows)))
        a_s = [
            cute.make_rmem_tensor(mma_s.partition_shape_A((TILE, lay.GROUP)), Float16)
            for _ in range(self.score_buffers)
        ]
        return thr_s, r_sb, acc_s, coords_s, a_s

    def _value_operands(self, mma_o, wg_tidx, dims: int):
        """A consumer thread's side of ``o^T += V^T p^T`` over ``dims`` output dims: its slice,
        the accumulator and its (dim, row) coordinates, and the ``value_buffers`` register
        operands V is widened into (the products accumulate from here on)."""
        thr_o = mma_o.get_slice(wg_tidx)
        acc_o = cute.make_rmem_tensor(mma_o.partition_shape_C((dims, self.rows)), Float32)
        coords_o = thr_o.partition_C(cute.make_identity_tensor((dims, self.rows)))
        a_o = [
            cute.make_rmem_tensor(mma_o.partition_shape_A((dims, 16)), Float16)
            for _ in range(self.value_buffers)
        ]
        mma_o.set(warpgroup.Field.ACCUMULATE, True)
        return thr_o, acc_o, coords_o, a_o

    def _p_destination(self, thr_s, s_p, buffer):
        """Where a thread writes its part of ``p^T`` buffer ``buffer``: where s^T's accumulator
        sits, the buffer seen as (token, row)."""
        s_p_tr = cute.make_tensor(s_p.iterator, cute.select(s_p.layout, mode=[1, 0, 2]))
        return thr_s.partition_C(s_p_tr[None, None, buffer])

    @cute.jit
    def _probabilities(self, acc_s, m_use, l_i, r_p, tok_scale, t_sp):
        """``p^T = exp2(s^T - max)`` (times the token's scale) in f16 into shared memory for
        the values product, and the rows' sums per thread grown."""
        for k in cutlass.range_constexpr(cute.size(acc_s)):
            j = accumulator_slot(k, self.rows)
            p = Float32(cute.math.exp2(acc_s[k] - m_use[j], fastmath=True))
            l_i[j] = l_i[j] + p
            if cutlass.const_expr(self.per_token):
                r_p[k] = (p * tok_scale[(k // 2) % 2]).to(Float16)
            else:
                r_p[k] = p.to(Float16)
        cute.autovec_copy(r_p, t_sp)
        cute.arch.fence_proxy(
            cute.arch.ProxyKind.async_shared, space=cute.arch.SharedSpace.shared_cta
        )

    @cute.jit
    def _tile_max(self, acc_s):
        """Each of the thread's rows' max over its tokens of the tile."""
        tile_max = cute.make_rmem_tensor((self.rows // 4,), Float32)
        tile_max.fill(_NEG_INF)
        for k in cutlass.range_constexpr(cute.size(acc_s)):
            j = accumulator_slot(k, self.rows)
            tile_max[j] = cute.arch.fmax(tile_max[j], acc_s[k])
        return tile_max

    @cute.jit
    def _group_row_sums(self, l_i, red, s_sum, w, wg, lane):
        """The group's row sums (``l_i``, per thread) totalled over its tokens into
        ``s_sum[row, wg]``, through ``red`` and the group's barrier."""
        slots = self.rows // 4
        for j in cutlass.range_constexpr(slots):
            l_i[j] = column_sum(l_i[j])
        if lane < 4:
            for j in cutlass.range_constexpr(slots):
                red[accumulator_column(j, lane), w, wg, 0] = l_i[j]
        cute.arch.barrier(barrier_id=1 + wg, number_of_threads=128)
        if w == 0 and lane < 4:
            for j in cutlass.range_constexpr(slots):
                n = accumulator_column(j, lane)
                s_sum[n, wg] = (
                    red[n, 0, wg, 0] + red[n, 1, wg, 0] + red[n, 2, wg, 0] + red[n, 3, wg, 0]
                )

    @cute.jit
    def _lazy_max(self, acc_s, acc_o, m_i, l_i, red, w, wg, lane, parity):
        """The online softmax's max with slack: while no score of the tile exceeds its row's
        running max by more than ``max_slack`` (which one barrier vote tells the whole group),
        the max stays, and with it the denominators and the output (``alpha`` = 1); only
        otherwise are the tile's maxima exchanged (``running_max``) and the output rescaled.
        Returns the max to subtract from the scores (0 for a row with nothing seen yet)."""
        slots = self.rows // 4
        tile_max = self._tile_max(acc_s)
        over = Int32(0)
        for j in cutlass.range_constexpr(slots):  # -inf + slack stays -inf: the first tile
            over = over | Int32(cutlass.select_(tile_max[j] > m_i[j] + self.max_slack, 1, 0))
        m_use = cute.make_rmem_tensor((slots,), Float32)
        for j in cutlass.range_constexpr(slots):
            m_use[j] = cutlass.select_(m_i[j] == _NEG_INF, Float32(0.0), m_i[j])
        if barrier_or(over, 1 + wg, 128) != 0:  # the same answer in the whole group
            alpha, m_new = running_max(acc_s, m_i, l_i, red, self.rows, w, wg, lane, parity)
            for j in cutlass.range_constexpr(slots):
                m_use[j] = m_new[j]
            for k in cutlass.range_constexpr(cute.size(acc_o)):
                acc_o[k] = acc_o[k] * alpha[accumulator_slot(k, self.rows)]
        return m_use

    @cute.jit
    def _merge_and_store(
        self, acc_o, handover, coords_o, s_q, s_max, s_sum, m_out, m_lse, m_part_o, m_part_lse,
        out_scale, first_row, num_splits, split, rows_per_req, row0, tid, lane,
    ):  # fmt: skip
        """Group 0: its rows plus group 1's (each rescaled to the larger of the two maxima),
        normalised and stored: the final bf16 rows (gathered in the spent query block and
        stored whole) and natural-log LSE, or a split's fp32 partial and base-2 LSE."""
        slots = self.rows // 4
        w0 = cute.make_rmem_tensor((slots,), Float32)
        w1 = cute.make_rmem_tensor((slots,), Float32)
        for j in cutlass.range_constexpr(slots):
            n = accumulator_column(j, lane % 4)
            m0, m1 = s_max[n, 0], s_max[n, 1]
            m = cute.arch.fmax(m0, m1)
            a0 = Float32(0.0)
            a1 = Float32(0.0)
            if m0 != _NEG_INF:
                a0 = Float32(cute.math.exp2(m0 - m, fastmath=True))
            if m1 != _NEG_INF:
                a1 = Float32(cute.math.exp2(m1 - m, fastmath=True))
            total = s_sum[n, 0] * a0 + s_sum[n, 1] * a1
            inv = Float32(0.0)
            if total > 0.0:
                inv = out_scale / total
            w0[j] = a0 * inv
            w1[j] = a1 * inv
        final = cutlass.const_expr(not self.split)
        if cutlass.const_expr(final):
            staged = staged_rows(cute.recast_ptr(s_q.iterator, dtype=BFloat16), self.rows,
                                 D_LATENT)  # fmt: skip
        for k in cutlass.range_constexpr(cute.size(acc_o)):
            d, n = coords_o[k]
            j = accumulator_slot(k, self.rows)
            value = acc_o[k] * w0[j] + handover[k, tid] * w1[j]
            dim = lay.value_dim(d)
            if cutlass.const_expr(final):
                staged[n, dim] = value.to(BFloat16)
            elif row0 + n < rows_per_req:
                m_part_o[(first_row + n) * num_splits + split, dim] = value
        if cutlass.const_expr(final):
            cute.arch.barrier(barrier_id=1, number_of_threads=128)
            store_staged_rows(staged, m_out, first_row, rows_per_req - row0, tid, 128)
        if tid < self.rows:
            n = tid
            if row0 + n < rows_per_req:
                m0, m1 = s_max[n, 0], s_max[n, 1]
                m = cute.arch.fmax(m0, m1)
                total = Float32(0.0)
                if m0 != _NEG_INF:
                    total = total + s_sum[n, 0] * Float32(cute.math.exp2(m0 - m, fastmath=True))
                if m1 != _NEG_INF:
                    total = total + s_sum[n, 1] * Float32(cute.math.exp2(m1 - m, fastmath=True))
                lse2 = Float32(_NEG_INF)
                if total > 0.0:
                    lse2 = m + cute.math.log2(total)
                if cutlass.const_expr(not final):
                    m_part_lse[(first_row + n) * num_splits + split] = lse2
                elif cutlass.const_expr(self.write_lse):
                    m_lse[first_row + n] = lse2 * math.log(2.0)
