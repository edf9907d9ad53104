"""The MLA attention backend: latent KV pages, ``tokenspeed.mla`` prefill and decode.

Same interface as the paged MHA backend; for MLA the arguments mean
``forward_extend(q [T, H, nope+rope], kv_c [T, R], k_pe [T, rope], layer, batch) -> [T, H, v]``
and ``forward_decode(q_latent [B, H, R+rope], kv_c, k_pe, layer, batch) -> [B, H, R]``, where
``layer`` is the ``MLAAttention`` core (it decompresses latents and holds the absorbed weights).

Extend steps gather each request's cached prefix latents from its pages, put them in front of
the new tokens' latents as one ragged pack (no padding), decompress the pack through
``kv_b_proj`` and run ``mla_prefill`` with the causal block aligned to the end. The new
tokens' latents are used as computed (not read back from the cache), so an FP8 cache only
rounds the prefix. The gather indices are built once per step on the host from the step's
lengths (no device sync), then shared by every layer.

Decode steps are the paged backend's metadata (block tables + sequence lengths), so the
CUDA-graph hooks are inherited unchanged.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from tokenspeed import kernels, mla
from tokenspeed.runtime.layers.attention.paged import PagedAttentionBackend

if TYPE_CHECKING:
    from tokenspeed.runtime.forward_batch import ForwardBatch
    from tokenspeed.runtime.kv_pool import MLAKVPool
    from tokenspeed.runtime.layers.mla import MLAAttention


@dataclass
class MLAExtendMetadata:
    """Where each request's KV rows come from in the ragged ``[prefix | new]`` pack."""

    cu_seqlens_q: torch.Tensor  # [B + 1] int32
    cu_seqlens_kv: torch.Tensor  # [B + 1] int32
    total_kv: int
    max_seqlen_q: int
    max_seqlen_kv: int
    prefix_slots: torch.Tensor | None  # [Np] int64 cache slots of the cached prefix tokens
    prefix_rows: torch.Tensor | None  # [Np] int64 their rows in the pack
    new_rows: torch.Tensor | None  # [T] int64 rows of the new tokens; None: pack == new tokens


def _ragged(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(request of each element, index within its request)`` for ragged ``lengths``."""
    total = int(lengths.sum())
    owner = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    starts = np.cumsum(lengths) - lengths
    return owner, np.arange(total, dtype=np.int64) - starts[owner]


def _requests_of_rows(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, q_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A speculative decode batch holds ``q_len`` consecutive rows per request, row j at
    ``seq_len - q_len + j``; the kernel reads one ``q_len``-token query per request: its
    first row's table and its last row's length (strided views; callers copy them once per
    forward, into fresh or static buffers, so no kernel reads strided metadata)."""
    return block_tables[::q_len], seq_lens[q_len - 1 :: q_len]


class MLAAttentionBackend(PagedAttentionBackend):
    """Stores latents with ``mla_store_kv``; prefill decompressed, decode absorbed."""

    name = "mla"
    kv_pool: MLAKVPool
    multi_token_decode = True  # a block's rows are one query, causal inside the block

    def __init__(self, kv_pool: MLAKVPool, solution: str | None = None) -> None:
        super().__init__(kv_pool, None)
        self.graph_request_tables: torch.Tensor | None = None
        self.graph_request_lens: torch.Tensor | None = None
        modes = ("mla.decode", "mla.prefill", "mla.store_kv")
        self._mla_override = {m: solution for m in modes} if solution else None

    def _forced(self) -> contextlib.AbstractContextManager[None]:
        if self._mla_override is None:
            return contextlib.nullcontext()
        return kernels.kernel_override(self._mla_override)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        super().init_forward_metadata(batch)
        if batch.mode.is_decode():
            q_len = int(batch.extras.get("decode_q_len", 1))
            if q_len > 1:
                tables, lens = _requests_of_rows(batch.block_tables, batch.seq_lens, q_len)
                batch.extras["mla_requests"] = (tables.contiguous(), lens.contiguous())
            return
        dev = batch.input_ids.device
        seq, prefix = batch.seq_lens_np, batch.prefix_lens_np
        cu_kv = np.zeros(len(seq) + 1, dtype=np.int64)
        np.cumsum(seq, out=cu_kv[1:])
        prefix_slots = prefix_rows = new_rows = None
        if int(prefix.sum()) > 0:
            page = self.kv_pool.page_size
            owner, pos = _ragged(prefix)
            owner_t = torch.from_numpy(owner).to(dev)
            pos_t = torch.from_numpy(pos).to(dev)
            pages = batch.block_tables[owner_t, pos_t // page].long()
            prefix_slots = pages * page + pos_t % page
            prefix_rows = torch.from_numpy(cu_kv[owner] + pos).to(dev)
            owner, j = _ragged(batch.extend_lens_np)
            new_rows = torch.from_numpy(cu_kv[owner] + prefix[owner] + j).to(dev)
        batch.attn_metadata = MLAExtendMetadata(
            cu_seqlens_q=batch.cu_seqlens_q,
            cu_seqlens_kv=torch.from_numpy(cu_kv.astype(np.int32)).to(dev),
            total_kv=int(cu_kv[-1]),
            max_seqlen_q=batch.max_extend_len,
            max_seqlen_kv=batch.max_seq_len,
            prefix_slots=prefix_slots,
            prefix_rows=prefix_rows,
            new_rows=new_rows,
        )

    def init_cuda_graph_state(self, max_bs: int, max_pages_per_req: int) -> None:
        super().init_cuda_graph_state(max_bs, max_pages_per_req)
        # a verify graph's per-request tables and lengths (of its rows), written at replay
        assert self.graph_block_tables is not None
        self.graph_request_tables = self.graph_block_tables.clone()
        self.graph_request_lens = torch.ones(max_bs, dtype=torch.int32, device=self.kv_pool.device)

    def init_forward_metadata_capture_cuda_graph(self, batch: ForwardBatch) -> None:
        super().init_forward_metadata_capture_cuda_graph(batch)
        q_len = int(batch.extras.get("decode_q_len", 1))
        if q_len > 1:  # static views: the graph reads what each replay writes there
            assert self.graph_request_tables is not None and self.graph_request_lens is not None
            n = batch.batch_size // q_len
            batch.extras["mla_requests"] = (
                self.graph_request_tables[:n],
                self.graph_request_lens[:n],
            )

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, block_tables: torch.Tensor, seq_lens: torch.Tensor, q_len: int = 1
    ) -> None:
        super().init_forward_metadata_replay_cuda_graph(bs, block_tables, seq_lens, q_len)
        if q_len > 1:
            assert self.graph_request_tables is not None and self.graph_request_lens is not None
            tables, lens = _requests_of_rows(block_tables, seq_lens, q_len)
            n, width = tables.shape
            self.graph_request_tables[:n, :width].copy_(tables, non_blocking=True)
            self.graph_request_tables[n : bs // q_len].fill_(self.kv_pool.scratch_page)
            self.graph_request_lens[:n].copy_(lens, non_blocking=True)
            self.graph_request_lens[n : bs // q_len].fill_(q_len)

    def _store(  # type: ignore[override]
        self, kv_c: torch.Tensor, k_pe: torch.Tensor, layer: MLAAttention, batch: ForwardBatch
    ) -> None:
        cache, scale = self.kv_pool.layer_cache(layer.layer_id)
        with self._forced():
            mla.mla_store_kv(kv_c, k_pe, cache, batch.slot_mapping, kv_scale=scale)

    def _gather_prefix(
        self, layer: MLAAttention, slots: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        """Cached latents at ``slots`` as ``[N, R + rope]`` in ``dtype`` (FP8 dequantized)."""
        cache, scale = self.kv_pool.layer_cache(layer.layer_id)
        flat = cache.view(-1, cache.shape[-1])
        rows = flat.index_select(0, slots)
        if scale is None:
            return rows.to(dtype)
        return (rows.float() * scale.view(-1).index_select(0, slots)[:, None]).to(dtype)

    def forward_extend(  # type: ignore[override]
        self,
        q: torch.Tensor,
        kv_c: torch.Tensor,
        k_pe: torch.Tensor,
        layer: MLAAttention,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """``q [T, H, nope+rope]`` over each request's cached prefix + new tokens -> ``[T, H, v]``."""
        self._store(kv_c, k_pe, layer, batch)
        meta: MLAExtendMetadata = batch.attn_metadata
        r = layer.kv_lora_rank
        if meta.new_rows is None:  # no cached prefix anywhere: the new tokens are the pack
            pack_c, pack_pe = kv_c, k_pe
        else:
            pack = q.new_empty(meta.total_kv, r + layer.qk_rope_head_dim)
            assert meta.prefix_slots is not None and meta.prefix_rows is not None
            pack[meta.prefix_rows] = self._gather_prefix(layer, meta.prefix_slots, q.dtype)
            pack[meta.new_rows, :r] = kv_c
            pack[meta.new_rows, r:] = k_pe
            pack_c, pack_pe = pack[:, :r], pack[:, r:]
        key, value = layer.decompress(pack_c, pack_pe)
        with self._forced():
            return mla.mla_prefill(
                q,
                key,
                value,
                meta.cu_seqlens_q,
                meta.cu_seqlens_kv,
                softmax_scale=layer.scale,
                causal=True,
                max_seqlen_q=meta.max_seqlen_q,
                max_seqlen_kv=meta.max_seqlen_kv,
            )

    def forward_decode(  # type: ignore[override]
        self,
        q: torch.Tensor,
        kv_c: torch.Tensor,
        k_pe: torch.Tensor,
        layer: MLAAttention,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """Latent query ``[B, H, R + rope]`` over the latent cache -> ``[B, H, R]``."""
        self._store(kv_c, k_pe, layer, batch)
        cache, scale = self.kv_pool.layer_cache(layer.layer_id)
        block_tables, seq_lens, _ = batch.attn_metadata
        q_len = int(batch.extras.get("decode_q_len", 1))
        if q_len > 1:
            block_tables, seq_lens = batch.extras["mla_requests"]
        with self._forced():
            out = mla.mla_decode(
                q.reshape(-1, q_len, *q.shape[1:]),
                cache,
                block_tables,
                seq_lens,
                layer.scale,
                kv_scale=scale,
                kv_lora_rank=layer.kv_lora_rank,
                max_seq_len=batch.extras.get("max_seq_len"),
            )
        assert isinstance(out, torch.Tensor)
        return out.reshape(-1, *out.shape[2:])
