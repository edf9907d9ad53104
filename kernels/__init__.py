"""TokenSpeed kernels: the ops model code calls, and the registry that picks their kernels.

Model and runtime code call the ops below and nothing under them; ``select_kernel`` /
``explain_selection`` expose how each call's implementation is chosen.
"""

from .catalog import register_builtin_kernels
from .device import DeviceInfo, device_info
from .ops import (
    apply_rotary_emb,
    fused_add_rms_norm,
    fused_moe,
    moe_route,
    paged_decode_attention,
    paged_extend_attention,
    rms_norm,
    silu_and_mul,
    store_kv,
)
from .overrides import env_var_name, kernel_config_summary, kernel_override, load_kernel_config
from .plugins import ENTRY_POINT_GROUP, plugin_errors
from .registry import Capability, KernelSpec, Priority, all_kernels, register_kernel
from .selection import (
    OBJECTIVES,
    Explanation,
    KernelSelectionError,
    Selection,
    clear_selection_cache,
    explain_selection,
    select_kernel,
    selection_records,
)
from .tuned import default_tuning_path, load_tuning_file, loaded_tuning_tables

register_builtin_kernels()


def kernel_info() -> dict[str, object]:
    """Everything about kernel selection in this process, as plain data (/get_server_info)."""
    return {
        "selections": selection_records(),
        "config": kernel_config_summary(),
        "tuning": loaded_tuning_tables(),
        "plugin_errors": plugin_errors(),
    }


__all__ = [
    "ENTRY_POINT_GROUP",
    "OBJECTIVES",
    "Capability",
    "DeviceInfo",
    "Explanation",
    "KernelSelectionError",
    "KernelSpec",
    "Priority",
    "Selection",
    "all_kernels",
    "apply_rotary_emb",
    "clear_selection_cache",
    "default_tuning_path",
    "device_info",
    "env_var_name",
    "explain_selection",
    "fused_add_rms_norm",
    "fused_moe",
    "kernel_config_summary",
    "kernel_info",
    "kernel_override",
    "load_kernel_config",
    "load_tuning_file",
    "loaded_tuning_tables",
    "moe_route",
    "paged_decode_attention",
    "paged_extend_attention",
    "plugin_errors",
    "register_kernel",
    "rms_norm",
    "select_kernel",
    "selection_records",
    "silu_and_mul",
    "store_kv",
]
