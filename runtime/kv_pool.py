"""Paged KV storage on the device, its host (CPU) tier, and how big to make them.

Device layout per layer: ``k [P + 1, page_size, Hk, D]`` and ``v`` alike. The scheduler is
told about ``P`` pages; the extra last page is scratch, where padded CUDA-graph rows write and
read so they never touch a live page. The host tier has the same per-layer layout in pinned
memory so page copies are plain indexed copies over PCIe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class KVLayout:
    """Shape facts of the cache: enough to size it without allocating it."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    page_size: int
    dtype: torch.dtype

    @property
    def bytes_per_page(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        per_token = self.num_kv_heads * (self.head_dim + self.v_head_dim) * elem
        return per_token * self.page_size * self.num_layers


def pages_for_budget(
    layout: KVLayout, max_total_tokens: int | None, memory_bytes: int | None
) -> int:
    """Device pages from a token budget (wins) or a byte budget."""
    if max_total_tokens:
        return max(1, math.ceil(max_total_tokens / layout.page_size))
    if memory_bytes is None:
        raise ValueError("either max_total_tokens or a memory budget is needed to size the KV pool")
    pages = int(memory_bytes // layout.bytes_per_page)
    if pages < 1:
        raise ValueError(
            f"KV cache budget of {memory_bytes} bytes holds no page "
            f"({layout.bytes_per_page} bytes per page); raise the KV cache memory"
        )
    return pages


def cuda_kv_budget_bytes(
    device: torch.device, gpu_memory_utilization: float, peak_torch_bytes: int
) -> int:
    """Bytes left for KV on CUDA after a profiling forward, as vLLM sizes it.

    ``total * utilization`` minus the profiled torch peak (weights + activations) minus memory
    other processes and non-torch allocations (CUDA context, NCCL) already hold.
    """
    free, total = torch.cuda.mem_get_info(device)
    reserved = torch.cuda.memory_reserved(device)
    non_torch = max(0, (total - free) - reserved)
    return int(total * gpu_memory_utilization - peak_torch_bytes - non_torch)


class PagedKVPool:
    """Per-layer K/V page buffers on the compute device."""

    def __init__(self, layout: KVLayout, num_pages: int, device: torch.device) -> None:
        self.layout = layout
        self.num_pages = num_pages
        self.page_size = layout.page_size
        self.device = device
        self.scratch_page = num_pages
        shape_k = (num_pages + 1, layout.page_size, layout.num_kv_heads, layout.head_dim)
        shape_v = (num_pages + 1, layout.page_size, layout.num_kv_heads, layout.v_head_dim)
        self.k_buffers = [
            torch.zeros(shape_k, dtype=layout.dtype, device=device)
            for _ in range(layout.num_layers)
        ]
        self.v_buffers = [
            torch.zeros(shape_v, dtype=layout.dtype, device=device)
            for _ in range(layout.num_layers)
        ]

    def layer_cache(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(k_cache, v_cache)`` of one layer, ``[P + 1, page_size, Hk, D]`` each."""
        return self.k_buffers[layer_id], self.v_buffers[layer_id]

    @property
    def size_bytes(self) -> int:
        return self.layout.bytes_per_page * (self.num_pages + 1)


class HostKVPool:
    """The host tier: pinned CPU pages that retracted or evicted KV is written back to."""

    def __init__(self, layout: KVLayout, num_pages: int, pin: bool) -> None:
        self.layout = layout
        self.num_pages = num_pages
        shape_k = (num_pages, layout.page_size, layout.num_kv_heads, layout.head_dim)
        shape_v = (num_pages, layout.page_size, layout.num_kv_heads, layout.v_head_dim)

        def alloc(shape: tuple[int, ...]) -> torch.Tensor:
            t = torch.zeros(shape, dtype=layout.dtype)
            return t.pin_memory() if pin else t

        self.k_buffers = [alloc(shape_k) for _ in range(layout.num_layers)]
        self.v_buffers = [alloc(shape_v) for _ in range(layout.num_layers)]


def _index(pages: object, device: torch.device) -> torch.Tensor:
    # int32 -> int64 copies, so read-only scheduler views never reach torch directly
    idx = np.array(pages, dtype=np.int64, copy=True).reshape(-1)
    return torch.from_numpy(idx).to(device)


def write_back(
    device_pool: PagedKVPool, host_pool: HostKVPool, device_pages: object, host_pages: object
) -> None:
    """Copy device pages to host pages, all layers; returns once the host copy is complete.

    It synchronises (the ``.cpu()`` of the gathered pages) because the scheduler frees the
    device pages as soon as we report the write-back done.
    """
    dev_idx = _index(device_pages, device_pool.device)
    host_idx = _index(host_pages, torch.device("cpu"))
    if dev_idx.numel() != host_idx.numel():
        raise ValueError("write-back needs as many host pages as device pages")
    if dev_idx.numel() == 0:
        return
    pairs = zip(
        device_pool.k_buffers + device_pool.v_buffers,
        host_pool.k_buffers + host_pool.v_buffers,
        strict=True,
    )
    for dev, host in pairs:
        host.index_copy_(0, host_idx, dev.index_select(0, dev_idx).cpu())


def load_back(
    host_pool: HostKVPool, device_pool: PagedKVPool, host_pages: object, device_pages: object
) -> None:
    """Copy host pages into device pages, all layers, on the current stream.

    Later kernels on the same stream see the data, so no synchronisation is needed here.
    """
    dev_idx = _index(device_pages, device_pool.device)
    host_idx = _index(host_pages, torch.device("cpu"))
    if dev_idx.numel() != host_idx.numel():
        raise ValueError("load-back needs as many device pages as host pages")
    if dev_idx.numel() == 0:
        return
    non_blocking = device_pool.device.type == "cuda"
    pairs = zip(
        host_pool.k_buffers + host_pool.v_buffers,
        device_pool.k_buffers + device_pool.v_buffers,
        strict=True,
    )
    for host, dev in pairs:
        staged = host.index_select(0, host_idx)
        if non_blocking:
            staged = staged.pin_memory()
        dev.index_copy_(0, dev_idx, staged.to(device_pool.device, non_blocking=non_blocking))
