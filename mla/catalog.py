"""Registers the MLA kernels under family ``mla`` (called on import of ``tokenspeed.mla``).

Modes: ``decode``, ``prefill``, ``kv_pack``, ``kv_pack_fp8``, ``store_kv``. Each has a torch
REFERENCE (any device) and a Triton PORTABLE kernel; FP8 decode is a separate entry because
Triton's e4m3 type needs compute capability 8.9 (Ada/Hopper) on a GPU.
"""

from __future__ import annotations

from tokenspeed.kernels.device import triton_available
from tokenspeed.kernels.registry import Capability, Priority, register_kernel
from tokenspeed.kernels.traits import TraitRule, between, one_of

__all__ = ["register_mla_kernels"]

_PKG = __name__.rpartition(".")[0]
FLOATS = ("float32", "float16", "bfloat16")
FP8 = ("float8_e4m3fn",)
HALF = ("float16", "bfloat16")

_REFERENCES = (
    ("decode", "torch_mla_decode", "mla_decode"),
    ("prefill", "torch_mla_prefill", "mla_prefill"),
    ("kv_pack", "torch_mla_kv_pack", "mla_kv_pack"),
    ("kv_pack_fp8", "torch_mla_kv_pack_fp8", "mla_kv_pack_quantize_fp8"),
    ("store_kv", "torch_mla_store_kv", "mla_store_kv"),
)

_POW2 = TraitRule("a power of two", lambda v: v > 0 and v & (v - 1) == 0)


def _pow2_plus_pow2(v: int) -> bool:
    """``v`` is a power of two, or one plus a smaller power of two (192 = 128 + 64)."""
    if v <= 0:
        return False
    rest = v - (1 << (v.bit_length() - 1))
    return rest & (rest - 1) == 0


_TWO_POW2 = TraitRule("a power of two or a sum of two (192 = 128 + 64)", _pow2_plus_pow2)

_registered = False


def _triton_capability(min_compute: tuple[int, int] = (8, 0)) -> Capability:
    return Capability(
        devices=("cuda",),
        vendors=("nvidia", "amd"),
        min_compute=min_compute,
        interpretable=True,
        requires=("triton",),
    )


def _triton(
    mode: str,
    name: str,
    impl: str,
    signature: dict[str, tuple[str, ...]],
    traits: dict[str, TraitRule],
    configs: tuple[str, str],
    *,
    min_compute: tuple[int, int] = (8, 0),
    description: str,
) -> None:
    register_kernel(
        "mla",
        mode,
        name=name,
        solution="triton",
        impl=f"{_PKG}.{impl}",
        capability=_triton_capability(min_compute),
        signatures=[signature],
        traits=traits,
        priority=Priority.PORTABLE,
        tags=("deterministic",),
        config_space=f"{_PKG}.configs:{configs[0]}",
        default_config=f"{_PKG}.configs:{configs[1]}",
        description=description,
    )


def _register_sdpa_prefill() -> None:
    """cuDNN's fused attention through torch SDPA (a vendor kernel, not ours), ranked above the
    Triton kernel where the shape traits prove it computes the op exactly: one request, no
    cached prefix (SDPA's top-left causal mask is then the op's end-aligned one), no LSE
    (the public SDPA call does not return it). Anything else runs the Triton kernel."""
    from tokenspeed.kernels.torch_ops import SDPA_HEAD_DIM

    register_kernel(
        "mla",
        "prefill",
        name="sdpa_mla_prefill",
        solution="sdpa",
        impl=f"{_PKG}.sdpa_prefill:mla_prefill",
        capability=Capability(devices=("cuda",), vendors=("nvidia",), min_compute=(8, 0)),
        signatures=[{"q": HALF, "k": HALF, "v": HALF}],
        traits={
            "batch": one_of(1),
            "prefix": one_of("none"),
            "return_lse": one_of(False),
            "qk_head_dim": SDPA_HEAD_DIM,
            "v_head_dim": SDPA_HEAD_DIM,
        },
        priority=Priority.PERFORMANT,
        tags=("deterministic",),
        config_space=f"{_PKG}.configs:sdpa_prefill_config_space",
        default_config=f"{_PKG}.configs:sdpa_prefill_default_config",
        description="torch SDPA, cuDNN backend first (vendor kernel): one request, no prefix",
    )


_PAGE_FOR_CUTE = TraitRule(
    "8, 16 or 32, or a multiple of 64", lambda v: v in (8, 16, 32) or (v > 0 and v % 64 == 0)
)
# Both CuTe decode entries (bf16 and FP8 caches) take the DeepSeek latent and 1-16 query tokens.
_CUTE_DECODE_TRAITS = {
    "kv_lora_rank": one_of(512),
    "head_dim": one_of(576),
    "q_len": between(1, 16),
    "page_size": _PAGE_FOR_CUTE,
}


_CUTE_SM90 = Capability(
    devices=("cuda",),
    vendors=("nvidia",),
    min_compute=(9, 0),
    max_compute=(9, 0),
    requires=("cutlass", "triton"),
)


def _register_cute_decode() -> None:
    """The CuTe DSL SM90 decodes (TMA + wgmma; a bf16 cache, or an FP8 one), where
    ``nvidia-cutlass-dsl`` is installed.

    It merges its split-KV partials with the Triton merge kernel, so it needs Triton too.
    """
    register_kernel(
        "mla",
        "decode",
        name="cute_mla_decode_sm90",
        solution="cute",
        impl=f"{_PKG}.cute_decode:mla_decode",
        capability=_CUTE_SM90,
        signatures=[{"q": ("bfloat16",), "kv_cache": ("bfloat16",)}],
        traits=dict(_CUTE_DECODE_TRAITS),
        priority=Priority.SPECIALIZED,
        tags=("deterministic",),
        description="CuTe DSL SM90 MLA decode: TMA ring, wgmma with KV tokens on M (up to "
        "32 rows per request) or 64 rows on M, two warp groups scoring a pair of tiles (64+)",
    )
    register_kernel(
        "mla",
        "decode",
        name="cute_mla_decode_fp8_sm90",
        solution="cute",
        impl=f"{_PKG}.cute_decode:mla_decode",
        capability=_CUTE_SM90,
        signatures=[{"q": ("bfloat16",), "kv_cache": FP8}],
        traits=dict(_CUTE_DECODE_TRAITS),
        priority=Priority.SPECIALIZED,
        tags=("deterministic",),
        description="CuTe DSL SM90 MLA decode over an FP8 cache: TMA-copied e4m3 tiles "
        "widened to f16 in the consumers' registers as wgmma operands, KV tokens on M, in "
        "blocks of 16, 32 or 64 rows",
    )


def register_mla_kernels() -> None:
    """Register the references, then the Triton kernels if Triton is installed (idempotent)."""
    global _registered
    if _registered:
        return
    _registered = True
    for mode, name, fn in _REFERENCES:
        register_kernel(
            "mla",
            mode,
            name=name,
            solution="torch",
            impl=f"{_PKG}.reference:{fn}",
            capability=Capability(devices=("cpu", "cuda")),
            priority=Priority.REFERENCE,
            tags=("deterministic", "reference"),
            description="torch reference: defines the op, float32 math",
        )
    if not triton_available():
        return
    _register_cute_decode()
    decode_traits = {
        "kv_lora_rank": _POW2,
        "num_heads": between(1, 1024),
        "q_len": between(1, 16),
    }
    decode_cfg = ("decode_config_space", "decode_default_config")
    _triton(
        "decode",
        "triton_mla_decode",
        "triton_decode:mla_decode",
        {"q": FLOATS, "kv_cache": FLOATS},
        decode_traits,
        decode_cfg,
        description="Triton split-KV MLA decode, all heads of a row block per KV tile",
    )
    _triton(
        "decode",
        "triton_mla_decode_fp8",
        "triton_decode:mla_decode",
        {"q": FLOATS, "kv_cache": FP8},
        decode_traits,
        ("decode_config_space", "decode_default_config_fp8"),
        min_compute=(8, 9),
        description="Triton split-KV MLA decode over an FP8 e4m3 latent cache",
    )
    _triton(
        "prefill",
        "triton_mla_prefill",
        "triton_prefill:mla_prefill",
        {"q": FLOATS, "k": FLOATS, "v": FLOATS},
        {"qk_head_dim": _TWO_POW2, "v_head_dim": _POW2},
        ("prefill_config_space", "prefill_default_config"),
        description="Triton varlen flash attention, q/k 192 + v 128, causal end-aligned",
    )
    _register_sdpa_prefill()
    pack_cfg = ("pack_config_space", "pack_default_config")
    _triton(
        "kv_pack",
        "triton_mla_kv_pack",
        "triton_kv:mla_kv_pack",
        {"x": FLOATS, "out": FLOATS},
        {},
        pack_cfg,
        description="Triton fused cat of kv_c and k_pe",
    )
    _triton(
        "kv_pack_fp8",
        "triton_mla_kv_pack_fp8",
        "triton_kv:mla_kv_pack_quantize_fp8",
        {"x": FLOATS, "out": FP8},
        {"per_token": one_of(True, False)},
        pack_cfg,
        min_compute=(8, 9),
        description="Triton fused cat + FP8 e4m3 quantize",
    )
    _triton(
        "store_kv",
        "triton_mla_store_kv",
        "triton_kv:mla_store_kv",
        {"x": FLOATS, "kv_cache": FLOATS},
        {},
        pack_cfg,
        description="Triton fused pack into the paged latent cache at slot_mapping",
    )
    _triton("store_kv", "triton_mla_store_kv_fp8", "triton_kv:mla_store_kv",
            {"x": FLOATS, "kv_cache": FP8}, {}, pack_cfg, min_compute=(8, 9),
            description="Triton fused pack + FP8 quantize into the paged latent cache")  # fmt: skip
