"""The paged attention backend over the kernels' ``store_kv`` / ``paged_*_attention`` ops.

Which implementation runs (torch reference on CPU, Triton on CUDA, ...) is the kernel
registry's choice; this backend only prepares metadata and calls the ops. Its metadata is just
the step's block tables, sequence lengths and ``cu_seqlens_q``, so CUDA-graph support is a pair
of static buffers that replay copies into.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch

from tokenspeed import kernels
from tokenspeed.runtime.layers.attention.base import AttentionBackend

if TYPE_CHECKING:
    from tokenspeed.runtime.forward_batch import ForwardBatch
    from tokenspeed.runtime.layers.attention.layer import Attention


class PagedAttentionBackend(AttentionBackend):
    """Stores new K/V by slot, then attends over each request's pages."""

    name = "paged"

    def __init__(self, kv_pool, solution: str | None = None) -> None:  # noqa: ANN001
        """``solution`` ("torch" / "triton") forces the attention kernels' implementation
        through the kernel registry's overrides; ``None`` lets the registry choose."""
        super().__init__(kv_pool)
        self.graph_block_tables: torch.Tensor | None = None
        self.graph_seq_lens: torch.Tensor | None = None
        self._override = (
            {"attention.decode": solution, "attention.extend": solution} if solution else None
        )

    def _forced(self) -> contextlib.AbstractContextManager[None]:
        if self._override is None:
            return contextlib.nullcontext()
        return kernels.kernel_override(self._override)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        batch.attn_metadata = (batch.block_tables, batch.seq_lens, batch.cu_seqlens_q)
        # host-side bound on the KV length: steers the decode kernel's split heuristic
        batch.extras["max_seq_len"] = batch.max_seq_len

    def init_cuda_graph_state(self, max_bs: int, max_pages_per_req: int) -> None:
        device = self.kv_pool.device
        # Padded rows point at the pool's scratch page with length 1, so they read valid memory.
        self.graph_block_tables = torch.full(
            (max_bs, max_pages_per_req), self.kv_pool.scratch_page, dtype=torch.int32, device=device
        )
        self.graph_seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)

    def init_forward_metadata_capture_cuda_graph(self, batch: ForwardBatch) -> None:
        assert self.graph_block_tables is not None and self.graph_seq_lens is not None
        bs = batch.batch_size
        batch.block_tables = self.graph_block_tables[:bs]
        batch.seq_lens = self.graph_seq_lens[:bs]
        batch.attn_metadata = (batch.block_tables, batch.seq_lens, batch.cu_seqlens_q)

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, block_tables: torch.Tensor, seq_lens: torch.Tensor, q_len: int = 1
    ) -> None:
        assert self.graph_block_tables is not None and self.graph_seq_lens is not None
        n, width = block_tables.shape
        self.graph_block_tables[:n, :width].copy_(block_tables, non_blocking=True)
        self.graph_block_tables[n:bs].fill_(self.kv_pool.scratch_page)
        self.graph_seq_lens[:n].copy_(seq_lens, non_blocking=True)
        self.graph_seq_lens[n:bs].fill_(q_len)

    def _store(
        self, k: torch.Tensor, v: torch.Tensor, layer: Attention, batch: ForwardBatch
    ) -> None:
        k_cache, v_cache = self.kv_pool.layer_cache(layer.layer_id)
        kernels.store_kv(k, v, k_cache, v_cache, batch.slot_mapping)

    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: Attention,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        self._store(k, v, layer, batch)
        k_cache, v_cache = self.kv_pool.layer_cache(layer.layer_id)
        block_tables, seq_lens, cu_seqlens_q = batch.attn_metadata
        with self._forced():
            return kernels.paged_extend_attention(
                q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, layer.scale, causal=True
            )

    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: Attention,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        self._store(k, v, layer, batch)
        k_cache, v_cache = self.kv_pool.layer_cache(layer.layer_id)
        block_tables, seq_lens, _ = batch.attn_metadata
        with self._forced():
            return kernels.paged_decode_attention(
                q,
                k_cache,
                v_cache,
                block_tables,
                seq_lens,
                layer.scale,
                max_seq_len=batch.extras.get("max_seq_len"),
            )
