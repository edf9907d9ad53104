"""TokenSpeed MLA kernels: absorbed decode over the latent cache, varlen prefill, K/V pack.

The ops below dispatch through the kernel registry (family ``mla``): a torch REFERENCE
defines each op and runs on CPU; Triton PORTABLE kernels run on GPUs (and on CPU under
``TRITON_INTERPRET=1`` when named by an override). ``docs/mla.md`` describes the layouts,
the decode kernel's head blocking and the benchmark. This package never imports
``tokenspeed.runtime``.
"""

from .catalog import register_mla_kernels
from .ops import (
    DecodePlan,
    mla_decode,
    mla_decode_plan,
    mla_kv_pack,
    mla_kv_pack_quantize_fp8,
    mla_prefill,
    mla_store_kv,
)
from .reference import FP8_MAX, softmax_scale_for

register_mla_kernels()

__all__ = [
    "FP8_MAX",
    "DecodePlan",
    "mla_decode",
    "mla_decode_plan",
    "mla_kv_pack",
    "mla_kv_pack_quantize_fp8",
    "mla_prefill",
    "mla_store_kv",
    "register_mla_kernels",
    "softmax_scale_for",
]
