"""The built-in kernels: torch references and the SDPA extend candidate always, Triton kernels
where Triton is installed."""

from __future__ import annotations

from .device import triton_available
from .registry import Capability, Priority, register_kernel

__all__ = ["OPS", "register_builtin_kernels"]

# (family, mode, reference kernel name, reference impl) for every public op.
OPS: tuple[tuple[str, str, str, str], ...] = (
    ("norm", "rms", "torch_rms_norm", "reference.norm:rms_norm"),
    ("norm", "fused_add_rms", "torch_fused_add_rms_norm", "reference.norm:fused_add_rms_norm"),
    ("rotary", "apply", "torch_rotary", "reference.rotary:apply_rotary_emb"),
    ("activation", "silu_and_mul", "torch_silu_and_mul", "reference.activation:silu_and_mul"),
    ("kv_cache", "store", "torch_store_kv", "reference.kv_cache:store_kv"),
    ("attention", "decode", "torch_paged_decode", "reference.attention:paged_decode_attention"),
    ("attention", "extend", "torch_paged_extend", "reference.attention:paged_extend_attention"),
    ("moe", "route", "torch_moe_route", "reference.moe:moe_route"),
    ("moe", "experts", "torch_fused_moe", "reference.moe:fused_moe"),
)

_PACKAGE = __name__.rpartition(".")[0]
_registered = False


def register_builtin_kernels() -> None:
    """Register the references, then the Triton kernels if Triton can be imported."""
    global _registered
    if _registered:
        return
    _registered = True
    for family, mode, name, impl in OPS:
        register_kernel(
            family,
            mode,
            name=name,
            solution="torch",
            impl=f"{_PACKAGE}.{impl}",
            capability=Capability(devices=("cpu", "cuda")),
            priority=Priority.REFERENCE,
            tags=("deterministic", "reference"),
            description="torch reference: defines the op, float32 math",
        )
    from .torch_ops import register_torch_kernels

    register_torch_kernels()
    if triton_available():
        from .triton_ops import register_triton_kernels

        register_triton_kernels()
