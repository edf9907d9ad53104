"""Choosing the attention backend from ``--attention-backend``."""

from __future__ import annotations

from tokenspeed.runtime.kv_pool import MLAKVPool
from tokenspeed.runtime.layers.attention.base import AttentionBackend
from tokenspeed.runtime.layers.attention.paged import PagedAttentionBackend

# name -> (backend class, forced kernel solution). ``auto`` lets the kernel registry choose
# torch or Triton per call; ``torch`` / ``triton`` force that implementation. Backends with
# their own metadata (FlashInfer, MLA) register here as they arrive.
_BACKENDS: dict[str, tuple[type[PagedAttentionBackend], str | None]] = {
    "auto": (PagedAttentionBackend, None),
    "paged": (PagedAttentionBackend, None),
    "torch": (PagedAttentionBackend, "torch"),
    "triton": (PagedAttentionBackend, "triton"),
}


def create_attention_backend(name: str | None, kv_pool) -> AttentionBackend:  # noqa: ANN001
    """Build the backend named by the server args; unknown names are a clear error.

    The pool's layout decides the family: an MLA latent pool gets the MLA backend (the name
    then only forces ``torch`` or ``triton`` for the ``tokenspeed.mla`` kernels).
    """
    key = (name or "auto").lower()
    if key not in _BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; choose one of {', '.join(sorted(_BACKENDS))}"
        )
    cls, solution = _BACKENDS[key]
    if isinstance(kv_pool, MLAKVPool):
        from tokenspeed.runtime.layers.attention.mla_backend import MLAAttentionBackend

        return MLAAttentionBackend(kv_pool, solution)
    return cls(kv_pool, solution)
