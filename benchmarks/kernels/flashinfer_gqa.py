"""FlashInfer's paged GQA decode as the peer in the decode sweep (issue #7 names it).

Optional: used only where ``flashinfer`` is installed (never a dependency of the project).
The adapter takes the sweep's inputs as they are (caches ``[pages, page, kv_heads, dim]``,
FlashInfer's "NHD" layout, and a block table) and turns the block table into FlashInfer's
page lists once per input set, in ``plan``, which syncs with the host; the timed call is
``run`` alone, as a server using FlashInfer would replay it.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

WORKSPACE_BYTES = 256 * 2**20  # FlashInfer's split-KV partials (it recommends 128 MiB)


def available() -> bool:
    """FlashInfer importable and a CUDA device present."""
    return torch.cuda.is_available() and importlib.util.find_spec("flashinfer") is not None


def page_lists(tables: torch.Tensor, lens: torch.Tensor, page: int) -> tuple[torch.Tensor, ...]:
    """FlashInfer's ``(indptr, indices, last_page_len)`` for a ``[batch, max_pages]`` block
    table: each request's first ``ceil(len / page)`` pages, in order."""
    counts = (lens.long() + page - 1) // page
    used = torch.arange(tables.shape[1], device=tables.device)[None, :] < counts[:, None]
    indptr = torch.zeros(lens.numel() + 1, dtype=torch.int32, device=tables.device)
    indptr[1:] = counts.cumsum(0)
    last = torch.where(counts > 0, lens.long() - (counts - 1) * page, 0)
    return indptr, tables[used].to(torch.int32), last.to(torch.int32)


class FlashInferDecode:
    """``BatchDecodeWithPagedKVCacheWrapper`` on CUDA cores, or on tensor cores (``backend``
    "fa2" / "fa3": FlashInfer runs its prefill kernels for the one query token)."""

    def __init__(self, tensor_cores: bool = False, backend: str = "auto") -> None:
        import flashinfer

        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        self._wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_tensor_cores=tensor_cores, backend=backend
        )
        self._planned: tuple[Any, ...] | None = None

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        tables: torch.Tensor,
        lens: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        _, page, kv_heads, head_dim = k_cache.shape
        key = (tables.data_ptr(), lens.data_ptr(), q.shape, k_cache.shape, scale)
        if key != self._planned:
            self._wrapper.plan(
                *page_lists(tables, lens, page), q.shape[1], kv_heads, head_dim, page,
                q_data_type=q.dtype, kv_data_type=k_cache.dtype, sm_scale=scale,
            )  # fmt: skip
            self._planned = key
        return self._wrapper.run(q, (k_cache, v_cache))
