"""CUDA-graph capture and replay of decode steps.

Decode steps are small and launch-bound: one graph per batch-size bucket replays the whole
model forward with a single launch. Inputs live in static buffers; a real batch is copied in,
padded rows point at the KV pool's scratch page (so they never touch live pages), and the
first ``n`` rows of the static output are the result. Any capture failure (an op that syncs
the host, say) disables graphs with a warning instead of failing the engine.

A runner with ``q_len > 1`` holds speculative verify steps of a backend with
``multi_token_decode`` (MLA): every request is ``q_len`` consecutive rows, read as one
``q_len``-token query; its buckets count requests, and a padded request reads ``q_len``
tokens of the scratch page. The executor allocates the backend's static metadata once, for
its largest runner, so runners never swap buffers under each other's captured graphs.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from tokenspeed.kernels.device import capture_stream
from tokenspeed.runtime.forward_batch import ForwardBatch, ForwardMode

logger = logging.getLogger("tokenspeed.cuda_graph")


def graph_buckets(max_bs: int) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, 8, then every 8 (then 16) up to ``max_bs``."""
    sizes = [b for b in (1, 2, 4) if b < max_bs]
    sizes += list(range(8, min(max_bs, 256) + 1, 8)) + list(range(272, max_bs + 1, 16))
    if not sizes or sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sorted(set(sizes))


class CudaGraphRunner:
    """Holds one captured decode graph per bucket (in rows) and replays the smallest that fits."""

    def __init__(
        self,
        model: torch.nn.Module,
        backend: Any,
        kv_pool: Any,
        max_bs: int,
        max_pages_per_req: int,
        hidden_size: int,
        dtype: torch.dtype,
        q_len: int = 1,
        pool: Any = None,
    ) -> None:
        self.model = model
        self.backend = backend
        self.kv_pool = kv_pool
        self.device = kv_pool.device
        self.max_bs = max_bs
        self.max_pages = max_pages_per_req
        self.q_len = q_len
        self.buckets = [b * q_len for b in graph_buckets(max(1, max_bs // q_len))]
        dev = self.device
        scratch_slot = kv_pool.scratch_page * kv_pool.page_size
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((max_bs,), scratch_slot, dtype=torch.int64, device=dev)
        self.cu_seqlens_q = torch.arange(max_bs + 1, dtype=torch.int32, device=dev)
        self.sample_indices = torch.arange(max_bs, dtype=torch.int64, device=dev)
        self.output = torch.zeros(max_bs, hidden_size, dtype=dtype, device=dev)
        self.scratch_slot = scratch_slot
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool: Any = pool  # graph memory, shareable: runners never replay at once
        self.replays = 0  # graph launches so far (tests)

    def _static_batch(self, bs: int) -> ForwardBatch:
        zeros = np.zeros(bs, np.int64)
        batch = ForwardBatch(
            mode=ForwardMode.DECODE,
            batch_size=bs,
            num_tokens=bs,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            slot_mapping=self.slot_mapping[:bs],
            block_tables=torch.empty(0),
            seq_lens=torch.empty(0),
            cu_seqlens_q=self.cu_seqlens_q[: bs + 1],
            sample_indices=self.sample_indices[:bs],
            seq_lens_np=zeros + 1,
            extend_lens_np=zeros + 1,
            prefix_lens_np=zeros,
            sample_rows_np=np.arange(bs),
            pool_indices_np=zeros,
        )
        batch.extras["attn_backend"] = self.backend
        if self.q_len > 1:
            batch.extras["decode_q_len"] = self.q_len
        self.backend.init_forward_metadata_capture_cuda_graph(batch)
        return batch

    def capture(self) -> bool:
        """Capture every bucket (largest first so smaller ones reuse its memory pool)."""
        try:
            stream = capture_stream(self.device)
            with torch.inference_mode():
                for bs in reversed(self.buckets):
                    batch = self._static_batch(bs)
                    stream.wait_stream(torch.cuda.current_stream(self.device))
                    with torch.cuda.stream(stream):
                        for _ in range(2):  # warm-up outside the graph (lazy inits, autotune)
                            self.model(batch.input_ids, batch.positions, batch)
                    torch.cuda.current_stream(self.device).wait_stream(stream)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=self.pool, stream=stream):
                        out = self.model(batch.input_ids, batch.positions, batch)
                        self.output[:bs].copy_(out)
                    if self.pool is None:
                        self.pool = graph.pool()
                    self.graphs[bs] = graph
            torch.cuda.synchronize(self.device)
            return True
        except Exception as exc:  # noqa: BLE001 - fall back to eager, loudly
            logger.warning("CUDA graph capture failed, running decode eagerly: %s", exc)
            self.graphs.clear()
            torch.cuda.synchronize(self.device)
            return False

    def can_run(self, batch: ForwardBatch) -> bool:
        return (
            bool(self.graphs)
            and batch.mode is ForwardMode.DECODE
            and int(batch.extras.get("decode_q_len", 1)) == self.q_len
            and batch.batch_size <= self.buckets[-1]
            and batch.block_tables.shape[1] <= self.max_pages
        )

    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        """Run a decode batch through the smallest captured graph that holds it."""
        n = batch.batch_size
        bs = next(b for b in self.buckets if b >= n)
        self.input_ids[:n].copy_(batch.input_ids, non_blocking=True)
        self.positions[:n].copy_(batch.positions, non_blocking=True)
        self.slot_mapping[:n].copy_(batch.slot_mapping, non_blocking=True)
        if bs > n:
            self.input_ids[n:bs].zero_()
            self.positions[n:bs].zero_()
            self.slot_mapping[n:bs].fill_(self.scratch_slot)
        self.backend.init_forward_metadata_replay_cuda_graph(
            bs, batch.block_tables, batch.seq_lens, q_len=self.q_len
        )
        self.graphs[bs].replay()
        self.replays += 1
        return self.output[:n]
