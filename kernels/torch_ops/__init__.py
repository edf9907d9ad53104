"""PERFORMANT kernels built from vendor-library torch calls (no Triton).

``sdpa_extend`` gathers a batch's paged K/V into contiguous tensors and runs
``torch.nn.functional.scaled_dot_product_attention`` (cuDNN / flash pick themselves on CUDA).
``cpu_paged_decode`` is decode attention for CPU float32 that reads only the pages each request
uses and sums V rows straight out of the cache (``embedding_bag``), without the reference's
full-width K/V copies; ``cpu_paged_extend`` runs each request of a prefill through SDPA's fused
CPU kernel instead of materialising its score matrix.
Registered by ``"module:function"`` path like the Triton kernels, so nothing here is imported
until it is selected.
"""

from __future__ import annotations

from ..registry import Capability, Priority, register_kernel
from ..traits import TraitRule, one_of

__all__ = ["register_torch_kernels"]

_KERNELS = __name__.rpartition(".")[0]  # tokenspeed.kernels

HALF = ("float16", "bfloat16")
# Flash and cuDNN attention take head dims that are multiples of 8 up to 256.
SDPA_HEAD_DIM = TraitRule("a multiple of 8 in [8, 256]", lambda v: v % 8 == 0 and 8 <= v <= 256)


def register_torch_kernels() -> None:
    """Register the SDPA extend candidate (CUDA only; ranks above the Triton kernel) and the
    CPU float32 decode and extend candidates (rank above the references there)."""
    register_kernel(
        "attention",
        "extend",
        name="sdpa_paged_extend",
        solution="sdpa",
        impl=f"{__name__}.sdpa_extend:paged_extend_attention",
        capability=Capability(devices=("cuda",), vendors=("nvidia", "amd"), min_compute=(8, 0)),
        signatures=[{"q": HALF, "kv_cache": HALF}],
        # Only where the shapes prove every request has no cached prefix and the same length
        # (see ``extend_prefix_trait``): then the batch is a dense [B, L] problem.
        traits={"prefix": one_of("none"), "head_dim": SDPA_HEAD_DIM},
        priority=Priority.PERFORMANT,
        tags=("deterministic",),
        config_space=f"{_KERNELS}.triton_ops.configs:sdpa_extend_config_space",
        default_config=f"{_KERNELS}.triton_ops.configs:sdpa_extend_default_config",
        description="gather pages + torch SDPA (cuDNN/flash)",
    )
    register_kernel(
        "attention",
        "decode",
        name="cpu_paged_decode",
        solution="torch_cpu",  # not "torch": forcing "torch" keeps meaning the reference
        impl=f"{__name__}.cpu_paged_decode:paged_decode_attention",
        capability=Capability(devices=("cpu",)),
        signatures=[{"q": "float32", "kv_cache": "float32"}],
        priority=Priority.PERFORMANT,
        tags=("deterministic",),
        description="live pages only, chunked QK bmm + embedding_bag PV (no V copy)",
    )
    register_kernel(
        "attention",
        "extend",
        name="cpu_paged_extend",
        solution="torch_cpu",
        impl=f"{__name__}.cpu_paged_extend:paged_extend_attention",
        capability=Capability(devices=("cpu",)),
        signatures=[{"q": "float32", "kv_cache": "float32"}],
        priority=Priority.PERFORMANT,
        tags=("deterministic",),
        description="per-request SDPA (fused CPU flash kernel, native GQA) over gathered pages",
    )
