"""The attention backend interface every implementation follows.

A backend owns the per-step attention metadata (built once per step, shared by all layers)
and the buffers CUDA-graph replay needs. Models never pick a backend or a kernel: their
``Attention`` layer calls ``backend.forward`` and the backend dispatches on the forward mode.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from tokenspeed.runtime.forward_batch import ForwardBatch
    from tokenspeed.runtime.kv_pool import PagedKVPool
    from tokenspeed.runtime.layers.attention.layer import Attention


class AttentionBackend(ABC):
    """Metadata init, CUDA-graph hooks, ``forward_extend`` (with cached prefix), ``forward_decode``."""

    name: str = "abstract"
    #: whether a decode batch may hold ``batch.extras["decode_q_len"]`` consecutive rows per
    #: request (a speculative block) decoded as one multi-token query; otherwise each
    #: drafted position is a decode row of its own
    multi_token_decode: bool = False

    def __init__(self, kv_pool: PagedKVPool) -> None:
        self.kv_pool = kv_pool

    @abstractmethod
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Prepare whatever all layers of this step share (called once per step)."""

    @abstractmethod
    def init_cuda_graph_state(self, max_bs: int, max_pages_per_req: int) -> None:
        """Allocate the static buffers that captured graphs read their metadata from."""

    @abstractmethod
    def init_forward_metadata_capture_cuda_graph(self, batch: ForwardBatch) -> None:
        """Point the metadata of a decode batch of ``batch.batch_size`` at the static buffers."""

    @abstractmethod
    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, block_tables: torch.Tensor, seq_lens: torch.Tensor, q_len: int = 1
    ) -> None:
        """Copy a real batch's metadata into the static buffers before a graph replay. A
        verify graph's rows come ``q_len`` per request; padded rows read ``q_len`` tokens of
        the scratch page."""

    @abstractmethod
    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: Attention,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """Prefill/extend: queries attend to their request's cached prefix plus the new tokens."""

    @abstractmethod
    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: Attention,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """One query token per request attends to its whole KV."""

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: Attention,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """``q [T,Hq,D]``, ``k/v [T,Hk,D]`` -> ``[T,Hq,Dv]``; decode steps take the decode path."""
        if batch.mode.is_decode():
            return self.forward_decode(q, k, v, layer, batch)
        return self.forward_extend(q, k, v, layer, batch)
