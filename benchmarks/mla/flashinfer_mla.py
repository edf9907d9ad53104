"""FlashInfer's MLA decode (its FlashAttention-3-based SM90 kernel) as the peer in the MLA
sweep (issue #8 names it).

Optional: used only where ``flashinfer`` is installed (never a dependency of the project).
It reads our cache in place: the ``[pages, page, 576]`` latent cache as a strided 512-dim
``ckv`` view and a 64-dim ``kpe`` view, the query likewise, so both kernels stream the same
bytes. The block table becomes FlashInfer's page list once per input set, in ``plan`` (a
host sync); the timed call is ``run`` alone.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

WORKSPACE_BYTES = 256 * 2**20
RANK = 512  # the latent (ckv) dims; the rest of the 576 are the rope (kpe) dims


def available() -> bool:
    """FlashInfer importable and a CUDA device present."""
    return torch.cuda.is_available() and importlib.util.find_spec("flashinfer") is not None


class FlashInferMlaDecode:
    """``BatchMLAPagedAttentionWrapper`` with one backend ("fa3" on Hopper, or "fa2")."""

    def __init__(self, backend: str = "fa3") -> None:
        import flashinfer.mla

        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        self._wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace, backend=backend)
        self._planned: tuple[Any, ...] | None = None

    def __call__(
        self,
        q: torch.Tensor,  # [batch, q_len, heads, 576]
        cache: torch.Tensor,  # [pages, page, 576]
        tables: torch.Tensor,  # [batch, max_pages] int32
        seq: torch.Tensor,  # [batch] int32
        scale: float,
        out: torch.Tensor,  # [batch, q_len, heads, 512]
    ) -> torch.Tensor:
        batch, q_len, heads, _ = q.shape
        page = cache.shape[1]
        key = (tables.data_ptr(), seq.data_ptr(), q.shape, cache.shape, scale)
        if key != self._planned:
            dev = q.device
            counts = (seq.long() + page - 1) // page
            used = torch.arange(tables.shape[1], device=dev)[None, :] < counts[:, None]
            kv_indptr = torch.zeros(batch + 1, dtype=torch.int32, device=dev)
            kv_indptr[1:] = counts.cumsum(0)
            qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device=dev) * q_len
            self._wrapper.plan(
                qo_indptr, kv_indptr, tables[used].to(torch.int32), seq.to(torch.int32), heads,
                RANK, cache.shape[-1] - RANK, page, q_len > 1, scale, q.dtype, cache.dtype,
            )  # fmt: skip
            self._planned = key
        rows = q.view(batch * q_len, heads, -1)
        self._wrapper.run(
            rows[..., :RANK], rows[..., RANK:], cache[..., :RANK], cache[..., RANK:],
            out=out.view(batch * q_len, heads, RANK),
        )  # fmt: skip
        return out
