"""The built-in kernels: torch references and the SDPA extend candidate always, Triton kernels
where Triton is installed, CuTe DSL kernels on Hopper where ``nvidia-cutlass-dsl`` is."""

from __future__ import annotations

import importlib.util

from .device import triton_available
from .registry import Capability, Priority, register_kernel
from .traits import TraitRule, at_least, between, one_of

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
    _register_cute_kernels()


# Hopper only, and only where CuTe DSL can be imported (the ``hopper`` extra).
CUTE_SM90 = Capability(
    devices=("cuda",),
    vendors=("nvidia",),
    min_compute=(9, 0),
    max_compute=(9, 0),
    requires=("cutlass",),
)
_CUTE_PAGE = TraitRule(
    "8, 16 or 32, or a multiple of 64", lambda v: v in (8, 16, 32) or (v > 0 and v % 64 == 0)
)


CUTE_DECODE_TRAITS = {
    "head_dim": one_of(64, 128),
    "v_head_dim": one_of(64, 128),
    "group_size": between(1, 16),
    "page_size": _CUTE_PAGE,
    # Where the H200 sweep measured it ahead of the Triton decode: 65-128 groups of long
    # contexts (16 x 8k: 97-98 % of copy at page 64 against 94-95 %, page 16 +1.6 points on
    # average); at 64 x 2k (512 groups) the Triton decode is as fast or faster.
    "kv_groups": one_of(128),
    "kv_len": at_least(4096),
}


def _register_cute_kernels() -> None:
    """The CuTe DSL SM90 paged decode (TMA page boxes, wgmma, optional two-CTA split), where
    CuTe DSL is installed (found, not imported: importing it is slow)."""
    if importlib.util.find_spec("cutlass") is None:
        return
    register_kernel(
        "attention",
        "decode",
        name="cute_paged_decode_sm90",
        solution="cute",
        impl=f"{_PACKAGE}.cute_ops.decode_attention:paged_decode_attention",
        capability=CUTE_SM90,
        signatures=[{"q": ("bfloat16",), "kv_cache": ("bfloat16",)}],
        traits=dict(CUTE_DECODE_TRAITS),
        priority=Priority.SPECIALIZED,
        tags=("deterministic",),
        config_space=f"{_PACKAGE}.cute_ops.configs:gqa_decode_config_space",
        default_config=f"{_PACKAGE}.cute_ops.configs:gqa_decode_default_config",
        description="CuTe DSL SM90 GQA decode: a TMA box per page into 64-token tiles, wgmma "
        "with tokens on M, a cluster of two CTAs per (request, KV head) merged at the end",
    )
