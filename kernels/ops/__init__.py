"""The public ops: each describes its call (formats, shape traits) and runs the chosen kernel.

Nothing here reads tensor values: traits come from shapes only, so dispatch never
synchronises with the device.
"""

from .activation import silu_and_mul
from .attention import paged_decode_attention, paged_extend_attention
from .kv_cache import store_kv
from .moe import fused_moe, moe_route
from .norm import fused_add_rms_norm, rms_norm
from .rotary import apply_rotary_emb

__all__ = [
    "apply_rotary_emb",
    "fused_add_rms_norm",
    "fused_moe",
    "moe_route",
    "paged_decode_attention",
    "paged_extend_attention",
    "rms_norm",
    "silu_and_mul",
    "store_kv",
]
