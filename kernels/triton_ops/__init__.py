"""Triton PORTABLE kernels, one module per op.

This ``__init__`` never imports Triton: kernels are registered by ``"module:function"``
path and their modules are imported only when a kernel is first selected, so a process
without Triton (or one that never leaves the reference path) never loads it.
"""

from __future__ import annotations

from ..registry import Capability, Priority, register_kernel
from ..traits import between, one_of

__all__ = ["TRITON_CAPABILITY", "register_triton_kernels"]

# CUDA/ROCm GPUs with bf16 tensor cores; on CPU only under TRITON_INTERPRET=1 when named.
TRITON_CAPABILITY = Capability(
    devices=("cuda",),
    vendors=("nvidia", "amd"),
    min_compute=(8, 0),
    interpretable=True,
    requires=("triton",),
)
FLOATS = ("float32", "float16", "bfloat16")

# (family, mode, name, module:function, signature, traits, config space, default config)
_KERNELS: tuple[tuple[str, str, str, str, dict, dict, str, str], ...] = (
    ("norm", "rms", "triton_rms_norm", "norm:rms_norm",
     {"x": FLOATS, "weight": FLOATS}, {}, "norm_config_space", "norm_default_config"),
    ("norm", "fused_add_rms", "triton_fused_add_rms_norm", "norm:fused_add_rms_norm",
     {"x": FLOATS, "residual": FLOATS, "weight": FLOATS}, {},
     "norm_config_space", "norm_default_config"),
    ("rotary", "apply", "triton_rotary", "rotary:apply_rotary_emb",
     {"q": FLOATS, "k": FLOATS, "cos_sin_cache": FLOATS}, {},
     "warps_config_space", "warps_default_config"),
    ("activation", "silu_and_mul", "triton_silu_and_mul", "activation:silu_and_mul",
     {"x": FLOATS}, {}, "silu_config_space", "silu_default_config"),
    ("kv_cache", "store", "triton_store_kv", "kv_cache:store_kv",
     {"k": FLOATS, "kv_cache": FLOATS}, {}, "warps_config_space", "warps_default_config"),
    ("attention", "decode", "triton_paged_decode", "decode_attention:paged_decode_attention",
     {"q": FLOATS, "kv_cache": FLOATS}, {"head_dim": between(16, 256)},
     "decode_config_space", "decode_default_config"),
    ("attention", "extend", "triton_paged_extend", "extend_attention:paged_extend_attention",
     {"q": FLOATS, "kv_cache": FLOATS}, {"head_dim": between(16, 256)},
     "extend_config_space", "extend_default_config"),
    ("moe", "route", "triton_moe_route", "moe_route:moe_route",
     {"router_logits": FLOATS},
     {"num_experts": between(1, 1024), "grouping": one_of("none", "pow2")},
     "warps_config_space", "route_default_config"),
    ("moe", "experts", "triton_fused_moe", "fused_moe:fused_moe",
     {"x": FLOATS, "weights": FLOATS}, {}, "moe_config_space", "moe_default_config"),
)  # fmt: skip


def register_triton_kernels() -> None:
    """Register every Triton kernel (the caller checked that Triton is installed)."""
    for family, mode, name, impl, signature, traits, space, default in _KERNELS:
        register_kernel(
            family,
            mode,
            name=name,
            solution="triton",
            impl=f"{__name__}.{impl}",
            capability=TRITON_CAPABILITY,
            signatures=[signature],
            traits=traits,
            priority=Priority.PORTABLE,
            tags=("deterministic",),
            config_space=f"{__name__}.configs:{space}",
            default_config=f"{__name__}.configs:{default}",
            description="Triton portable kernel",
        )
