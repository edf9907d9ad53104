"""Paged KV storage on the device, its host (CPU) tier, and how big to make them.

Two layouts sit behind one pool interface:

* ``KVLayout`` (MHA/GQA): per layer ``k [P + 1, page_size, Hk, D]`` and ``v`` alike.
* ``MLALayout`` (DeepSeek MLA): per layer one latent vector per token,
  ``kv [P + 1, page_size, kv_lora_rank + rope_dim]`` (576 for DeepSeek-V3) holding
  ``[compressed kv | rotated shared rope key]``; an FP8 cache adds a per-token float32
  scale ``[P + 1, page_size]`` (the layout ``tokenspeed.mla`` writes and reads).

A layout lists the per-page tensors of one layer (``page_shapes``); pools allocate one tensor
per (layer, entry) and expose them flat as ``buffers``, so sizing, write-back and load-back
are layout-agnostic. The scheduler is told about ``P`` pages; the extra last page is scratch,
where padded CUDA-graph rows write and read so they never touch a live page. The host tier
has the same per-layer tensors in pinned memory so page copies are plain indexed copies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

PageShapes = list[tuple[tuple[int, ...], torch.dtype]]


def _bytes_per_page(shapes: PageShapes, num_layers: int) -> int:
    total = 0
    for shape, dtype in shapes:
        total += math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return total * num_layers


@dataclass(frozen=True)
class KVLayout:
    """MHA/GQA cache shape facts: enough to size it without allocating it."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    page_size: int
    dtype: torch.dtype

    def page_shapes(self) -> PageShapes:
        """Per-page shape and dtype of each tensor one layer holds: K then V."""
        s, h = self.page_size, self.num_kv_heads
        return [((s, h, self.head_dim), self.dtype), ((s, h, self.v_head_dim), self.dtype)]

    @property
    def bytes_per_page(self) -> int:
        return _bytes_per_page(self.page_shapes(), self.num_layers)


FP8_KV_DTYPES = (torch.float8_e4m3fn,)


@dataclass(frozen=True)
class MLALayout:
    """MLA latent cache shape facts: one ``kv_lora_rank + rope_dim`` vector per token per layer.

    ``dtype`` is the storage dtype: the model dtype, or ``float8_e4m3fn``, which adds a
    float32 scale per token (quantized on store, dequantized by the attention kernels).
    """

    num_layers: int
    kv_lora_rank: int
    rope_dim: int
    page_size: int
    dtype: torch.dtype

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.rope_dim

    @property
    def is_fp8(self) -> bool:
        return self.dtype in FP8_KV_DTYPES

    def page_shapes(self) -> PageShapes:
        """Per-page tensors of one layer: the latent vectors, then (FP8 only) their scales."""
        shapes: PageShapes = [((self.page_size, self.latent_dim), self.dtype)]
        if self.is_fp8:
            shapes.append(((self.page_size,), torch.float32))
        return shapes

    @property
    def bytes_per_page(self) -> int:
        return _bytes_per_page(self.page_shapes(), self.num_layers)


AnyKVLayout = KVLayout | MLALayout


def pages_for_budget(
    layout: AnyKVLayout, max_total_tokens: int | None, memory_bytes: int | None
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


class KVPool:
    """Per-layer page buffers on the compute device; subclasses name them per layout."""

    def __init__(self, layout: AnyKVLayout, num_pages: int, device: torch.device) -> None:
        self.layout = layout
        self.num_pages = num_pages
        self.page_size = layout.page_size
        self.device = device
        self.scratch_page = num_pages
        # layer_buffers[layer][entry]: one tensor per entry of layout.page_shapes()
        self.layer_buffers: list[list[torch.Tensor]] = [
            [
                torch.zeros((num_pages + 1, *shape), dtype=dtype, device=device)
                for shape, dtype in layout.page_shapes()
            ]
            for _ in range(layout.num_layers)
        ]

    @property
    def buffers(self) -> list[torch.Tensor]:
        """Every page tensor, entry-major (all layers' first entry, then the second, ...)."""
        entries = len(self.layout.page_shapes())
        return [layer[e] for e in range(entries) for layer in self.layer_buffers]

    @property
    def size_bytes(self) -> int:
        return self.layout.bytes_per_page * (self.num_pages + 1)


class PagedKVPool(KVPool):
    """MHA/GQA pool: ``k_buffers[layer]``, ``v_buffers[layer]``, ``[P + 1, page_size, Hk, D]``."""

    layout: KVLayout

    def __init__(self, layout: KVLayout, num_pages: int, device: torch.device) -> None:
        super().__init__(layout, num_pages, device)
        self.k_buffers = [b[0] for b in self.layer_buffers]
        self.v_buffers = [b[1] for b in self.layer_buffers]

    def layer_cache(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(k_cache, v_cache)`` of one layer, ``[P + 1, page_size, Hk, D]`` each."""
        return self.k_buffers[layer_id], self.v_buffers[layer_id]


class MLAKVPool(KVPool):
    """MLA latent pool: ``kv_buffers[layer]`` ``[P + 1, page_size, latent_dim]`` (+ FP8 scales)."""

    layout: MLALayout

    def __init__(self, layout: MLALayout, num_pages: int, device: torch.device) -> None:
        super().__init__(layout, num_pages, device)
        self.kv_buffers = [b[0] for b in self.layer_buffers]
        self.scale_buffers = [b[1] for b in self.layer_buffers] if layout.is_fp8 else None

    def layer_cache(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(latent_cache [P + 1, S, D], per-token scale [P + 1, S] or None)`` of one layer."""
        scale = self.scale_buffers[layer_id] if self.scale_buffers is not None else None
        return self.kv_buffers[layer_id], scale


def make_kv_pool(layout: AnyKVLayout, num_pages: int, device: torch.device) -> KVPool:
    """The device pool class for a layout."""
    if isinstance(layout, MLALayout):
        return MLAKVPool(layout, num_pages, device)
    return PagedKVPool(layout, num_pages, device)


class HostKVPool:
    """The host tier: pinned CPU pages that retracted or evicted KV is written back to.

    Same tensors as the device pool of the layout (without the scratch page), in the same
    ``buffers`` order, so page copies pair them up one to one.
    """

    def __init__(self, layout: AnyKVLayout, num_pages: int, pin: bool) -> None:
        self.layout = layout
        self.num_pages = num_pages

        def alloc(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            t = torch.zeros((num_pages, *shape), dtype=dtype)
            return t.pin_memory() if pin else t

        self.buffers = [
            alloc(shape, dtype)
            for shape, dtype in layout.page_shapes()
            for _ in range(layout.num_layers)
        ]


def _raw(t: torch.Tensor) -> torch.Tensor:
    """FP8 pages are copied as bytes (CPU ``index_copy_`` has no float8 kernels)."""
    return t.view(torch.uint8) if t.dtype in FP8_KV_DTYPES else t


def _index(pages: object, device: torch.device) -> torch.Tensor:
    # int32 -> int64 copies, so read-only scheduler views never reach torch directly
    idx = np.array(pages, dtype=np.int64, copy=True).reshape(-1)
    return torch.from_numpy(idx).to(device)


def write_back(
    device_pool: KVPool, host_pool: HostKVPool, device_pages: object, host_pages: object
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
    for dev, host in zip(device_pool.buffers, host_pool.buffers, strict=True):
        _raw(host).index_copy_(0, host_idx, _raw(dev).index_select(0, dev_idx).cpu())


def load_back(
    host_pool: HostKVPool, device_pool: KVPool, host_pages: object, device_pages: object
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
    for host, dev in zip(host_pool.buffers, device_pool.buffers, strict=True):
        staged = _raw(host).index_select(0, host_idx)
        if non_blocking:
            staged = staged.pin_memory()
        _raw(dev).index_copy_(0, dev_idx, staged.to(device_pool.device, non_blocking=non_blocking))
