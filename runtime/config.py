"""`ServerArgs`: the single source of every engine option.

Each option is declared once here, with its type, default, help text, group and validation.
The `serve` command's flags, recipe files (TOML) and `--save-recipe` are all generated from
these declarations, so adding an option is a one-place change.

Resolution order: defaults < recipe TOML < command-line flags (see `resolve_server_args`).
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GROUPS: dict[str, str] = {
    "model": "Model",
    "cache": "KV cache",
    "scheduler": "Scheduler",
    "parallel": "Parallelism",
    "kernels": "Kernels",
    "server": "Server",
    "speculative": "Speculative decoding",
    "disaggregation": "Prefill/decode disaggregation",
}


class ConfigError(ValueError):
    """An invalid configuration, with where it came from (file and key) when known."""

    def __init__(self, reason: str, *, key: str | None = None, source: str | None = None):
        self.reason = reason
        self.key = key
        self.source = source
        where = ": ".join(p for p in (source, key) if p)
        super().__init__(f"{where}: {reason}" if where else reason)


@dataclass(frozen=True)
class OptionSpec:
    """How one `ServerArgs` field appears to users: group, help, flag and checks."""

    group: str
    help: str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    parse: Callable[[Any], Any] | None = None  # for values given as strings (flags, TOML)
    metavar: str | None = None


def option(default: Any, group: str, help: str, **spec: Any) -> Any:
    """Declare a `ServerArgs` field together with its user-facing spec."""
    meta = {"spec": OptionSpec(group=group, help=help, **spec)}
    if isinstance(default, dict | list):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
}


def parse_size(value: Any) -> int | None:
    """Bytes from an int or a string such as '512MiB' or '2GB'."""
    if value is None or isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value)
        if m and m.group(2).lower() in _SIZE_UNITS:
            return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
    raise ValueError(f"expected a size in bytes such as 536870912 or '512MiB', got {value!r}")


def parse_json_object(value: Any) -> dict[str, Any]:
    """A dict from a dict or from a JSON object string (flags pass JSON)."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"not valid JSON ({e.msg} at column {e.colno})") from None
        if isinstance(parsed, dict):
            return parsed
    raise ValueError(f"expected a JSON object, got {value!r}")


@dataclass
class ServerArgs:
    """Every option of the engine and server; see the module docstring."""

    # --- model -------------------------------------------------------------------------
    model: str | None = option(
        None,
        "model",
        "A Hugging Face model directory, a shipped public architecture name (see "
        "`tokenspeed recipes list`; needs --load-format dummy), or nothing for the embedded "
        "tiny model.",
        metavar="PATH|NAME",
    )
    tokenizer: str | None = option(
        None, "model", "Tokenizer directory (default: the model's).", metavar="PATH"
    )
    served_model_name: str | None = option(
        None, "model", "Model name reported by the API (default: the model argument)."
    )
    dtype: str = option(
        "auto",
        "model",
        "Weight and activation dtype; auto takes the "
        "checkpoint's (float32 on CPU for float16/bfloat16 checkpoints).",
        choices=("auto", "bfloat16", "float16", "float32"),
    )
    load_format: str = option(
        "auto",
        "model",
        "dummy: random weights with the real architecture, no checkpoint needed.",
        choices=("auto", "safetensors", "dummy"),
    )
    hf_overrides: dict[str, Any] = option(
        {},
        "model",
        "JSON object merged into the model's config.json, e.g. '{\"num_hidden_layers\": 2}'.",
        parse=parse_json_object,
        metavar="JSON",
    )
    max_model_len: int | None = option(
        None,
        "model",
        "Longest sequence (prompt + output); default from the model config.",
        minimum=1,
    )
    seed: int = option(0, "model", "Seed for dummy weights and for unseeded sampling.", minimum=0)
    chat_template: str | None = option(
        None, "model", "Jinja chat template file overriding the tokenizer's.", metavar="PATH"
    )
    reasoning_parser: str | None = option(
        None,
        "model",
        "Split chat output into reasoning_content and content: qwen3 (hybrid thinking), "
        "deepseek-r1 (the template opens the thinking block), deepseek-v3 (V3.1/V3.2: "
        "thinking when the request sets chat_template_kwargs thinking), kimi_k2 (K2-Thinking, "
        "K2.5), kimi (Kimi-VL-Thinking tags).",
    )
    tool_call_parser: str | None = option(
        None,
        "model",
        "Parse the model's tool calls into tool_calls (and allow tool_choice auto): qwen25 / "
        "hermes (<tool_call> JSON blocks), deepseekv3, deepseekv31, kimi_k2.",
    )
    device: str = option(
        "auto",
        "model",
        "Where the model runs; auto picks CUDA when present.",
        choices=("auto", "cpu", "cuda"),
    )

    # --- KV cache ----------------------------------------------------------------------
    page_size: int = option(
        16,
        "cache",
        "Tokens per KV page (the unit of allocation and of prefix sharing).",
        minimum=1,
        maximum=1024,
    )
    kv_cache_dtype: str = option(
        "auto",
        "cache",
        "KV cache storage dtype; auto follows --dtype.",
        choices=("auto", "fp8", "fp8_e4m3", "fp8_e5m2"),
    )
    gpu_memory_utilization: float = option(
        0.9,
        "cache",
        "Fraction of GPU memory for weights, activations and KV cache (CUDA).",
        minimum=0.0,
        maximum=1.0,
        exclusive_minimum=True,
    )
    max_total_tokens: int | None = option(
        None, "cache", "KV pool size in tokens; overrides memory-based sizing.", minimum=1
    )
    kv_cache_memory: int | None = option(
        None,
        "cache",
        "KV pool size in bytes on CPU, e.g. 512MiB (default 256MiB on CPU).",
        parse=parse_size,
        minimum=1,
        metavar="SIZE",
    )
    host_kv_cache_memory: int = option(
        0,
        "cache",
        "Host (CPU) tier of the prefix cache in bytes; 0 disables it. Retracted "
        "requests are written back there instead of recomputed.",
        parse=parse_size,
        minimum=0,
        metavar="SIZE",
    )
    enable_prefix_caching: bool = option(
        True, "cache", "Reuse the KV of shared prompt prefixes (radix tree over full pages)."
    )

    # --- scheduler ---------------------------------------------------------------------
    chunked_prefill_size: int = option(
        8192,
        "scheduler",
        "Token budget of one step: longer prompts are prefilled in chunks so decodes keep running.",
        minimum=1,
    )
    max_num_seqs: int = option(256, "scheduler", "Most requests in one batch.", minimum=1)
    enable_mixed_batch: bool = option(
        False, "scheduler", "Run prefill chunks and decodes in the same forward (MIXED mode)."
    )

    # --- parallelism -------------------------------------------------------------------
    tensor_parallel_size: int = option(1, "parallel", "Tensor-parallel ranks.", minimum=1)
    data_parallel_size: int = option(1, "parallel", "Data-parallel replicas.", minimum=1)
    world_size: int | None = option(
        None,
        "parallel",
        "Total ranks (default tensor x data parallel size); must equal it.",
        minimum=1,
    )
    attn_tp_size: int | None = option(
        None, "parallel", "Tensor-parallel size of attention layers (default: TP size).", minimum=1
    )
    dense_tp_size: int | None = option(
        None, "parallel", "Tensor-parallel size of dense MLP layers (default: TP size).", minimum=1
    )
    moe_tp_size: int | None = option(
        None,
        "parallel",
        "Tensor-parallel size inside each MoE expert (default: TP size, or 1 "
        "with expert parallelism).",
        minimum=1,
    )
    enable_expert_parallel: bool = option(
        False, "parallel", "Shard MoE experts across ranks instead of splitting each expert."
    )

    # --- kernels -----------------------------------------------------------------------
    attention_backend: str = option(
        "auto",
        "kernels",
        "Attention backend; auto lets the kernel registry choose (the torch reference on CPU).",
        choices=("auto", "torch", "triton"),
    )
    moe_backend: str = option(
        "auto", "kernels", "Fused-MoE implementation.", choices=("auto", "torch", "triton")
    )
    sampling_backend: str = option(
        "auto", "kernels", "Sampling implementation.", choices=("auto", "torch")
    )
    disable_cuda_graph: bool = option(
        False, "kernels", "Run decode steps eagerly instead of replaying captured CUDA graphs."
    )
    cuda_graph_max_bs: int = option(
        256,
        "kernels",
        "Largest decode batch captured as a CUDA graph; larger ones run eagerly.",
        minimum=1,
    )
    kernel_config: str | None = option(
        None, "kernels", "TOML file of kernel overrides and tuned configurations.", metavar="PATH"
    )

    # --- server ------------------------------------------------------------------------
    host: str = option("127.0.0.1", "server", "Address to listen on.")
    port: int = option(8000, "server", "Port to listen on.", minimum=0, maximum=65535)
    enable_log_request_stats: bool = option(
        False, "server", "Log one line of per-request stats when each request finishes."
    )
    kv_events_config: dict[str, Any] = option(
        {},
        "server",
        "Publish KV-cache events (ZMQ PUB), JSON such as "
        '\'{"endpoint": "tcp://*:5557", "topic": "kv"}\'; empty disables.',
        parse=parse_json_object,
        metavar="JSON",
    )

    # --- speculative decoding ----------------------------------------------------------
    speculative_algorithm: str | None = option(
        None,
        "speculative",
        "Speculative decoding drafter: NGRAM (prompt lookup: the tokens that followed the "
        "latest earlier occurrence of the last few tokens) or MTP (the checkpoint's "
        "multi-token-prediction layer: DeepSeek-V3/R1). Outputs equal plain decoding.",
        choices=("NGRAM", "EAGLE3", "MTP"),
    )
    speculative_num_steps: int = option(
        3,
        "speculative",
        "MTP: runs of the MTP layer per verify, one draft each (speculative_num_draft_tokens "
        "minus one); NGRAM drafts in one lookup.",
        minimum=1,
    )
    speculative_num_draft_tokens: int = option(
        4,
        "speculative",
        "Tokens a decode step verifies: the last token and up to this many minus one drafts.",
        minimum=1,
    )

    # --- disaggregation ----------------------------------------------------------------
    disaggregation_mode: str = option(
        "null",
        "disaggregation",
        "Role in prefill/decode disaggregation.",
        choices=("null", "prefill", "decode"),
    )

    # ------------------------------------------------------------------------------------
    def validate(self) -> None:
        """Check contradictions between options; raises `ConfigError` naming the options."""
        tp, dp = self.tensor_parallel_size, self.data_parallel_size
        if self.world_size is not None and self.world_size != tp * dp:
            raise ConfigError(
                f"world_size={self.world_size} but tensor_parallel_size x data_parallel_size "
                f"= {tp} x {dp} = {tp * dp}",
                key="world_size",
            )
        world = tp * dp
        for name in ("attn_tp_size", "dense_tp_size", "moe_tp_size"):
            size = getattr(self, name)
            if size is not None and world % size:
                raise ConfigError(f"{name}={size} does not divide the world size {world}", key=name)
        algorithm, drafts = self.speculative_algorithm, self.speculative_num_draft_tokens
        if algorithm in ("NGRAM", "MTP") and drafts < 2:
            raise ConfigError(
                f"{algorithm} verifies the last token and at least one draft: needs 2 or more",
                key="speculative_num_draft_tokens",
            )
        if algorithm == "MTP" and self.speculative_num_steps != drafts - 1:
            raise ConfigError(
                f"MTP drafts one token per step: speculative_num_steps "
                f"({self.speculative_num_steps}) must be speculative_num_draft_tokens ({drafts}) "
                "minus one",
                key="speculative_num_steps",
            )
        if self.enable_expert_parallel and world == 1:
            raise ConfigError(
                "expert parallelism needs more than one rank", key="enable_expert_parallel"
            )
        if self.max_total_tokens is not None and self.kv_cache_memory is not None:
            raise ConfigError(
                "both size the KV pool: give max_total_tokens or kv_cache_memory, not both",
                key="kv_cache_memory",
            )
        if self.max_total_tokens is not None and self.max_total_tokens < self.page_size:
            raise ConfigError(
                f"max_total_tokens={self.max_total_tokens} is smaller than one "
                f"page ({self.page_size} tokens)",
                key="max_total_tokens",
            )

    def unsupported_options(self) -> list[str]:
        """Options set to values this build cannot honour yet, each with the reason."""
        return [
            f"{name}={getattr(self, name)!r}: {reason}"
            for name, (check, reason) in _NOT_IN_THIS_BUILD.items()
            if check(self)
        ]

    def to_dict(self) -> dict[str, Any]:
        """The options as plain data (for `/get_server_info`, logs and recipes)."""
        return {f.name: getattr(self, f.name) for f in option_fields()}


# The parsers of runtime/parsers/ (named here so that checking a configuration imports nothing).
_BUILT_REASONING_PARSERS = ("deepseek-r1", "deepseek-v3", "kimi", "kimi_k2", "qwen3")
_BUILT_TOOL_CALL_PARSERS = ("deepseekv3", "deepseekv31", "hermes", "kimi_k2", "qwen25")

# Options declared above whose non-default values this build cannot honour yet. Each entry
# disappears when the feature lands; `serve` refuses to start with any of them.
_NOT_IN_THIS_BUILD: dict[str, tuple[Callable[[ServerArgs], bool], str]] = {
    "kv_cache_dtype": (
        lambda a: a.kv_cache_dtype == "fp8_e5m2",
        "the FP8 KV cache is e4m3 (fp8, fp8_e4m3) and exists for MLA models only",
    ),
    "tensor_parallel_size": (
        lambda a: a.tensor_parallel_size > 1,
        "multi-GPU tensor parallelism is not built yet",
    ),
    "data_parallel_size": (lambda a: a.data_parallel_size > 1, "data parallelism is not built yet"),
    "enable_expert_parallel": (
        lambda a: a.enable_expert_parallel,
        "expert parallelism is not built yet",
    ),
    "reasoning_parser": (
        lambda a: a.reasoning_parser not in (None, *_BUILT_REASONING_PARSERS),
        f"the reasoning parsers built are {', '.join(_BUILT_REASONING_PARSERS)}",
    ),
    "tool_call_parser": (
        lambda a: a.tool_call_parser not in (None, *_BUILT_TOOL_CALL_PARSERS),
        f"the tool-call parsers built are {', '.join(_BUILT_TOOL_CALL_PARSERS)}",
    ),
    "speculative_algorithm": (
        lambda a: a.speculative_algorithm not in (None, "NGRAM", "MTP"),
        "the speculative drafters built are NGRAM and MTP (EAGLE3 is not)",
    ),
    "disaggregation_mode": (
        lambda a: a.disaggregation_mode != "null",
        "prefill/decode disaggregation is not built yet",
    ),
}


def option_fields() -> list[dataclasses.Field]:
    """The user-facing fields of `ServerArgs`, in declaration order."""
    return [f for f in dataclasses.fields(ServerArgs) if "spec" in f.metadata]


def spec_of(f: dataclasses.Field) -> OptionSpec:
    return f.metadata["spec"]


def field_types() -> dict[str, Any]:
    """Resolved type annotations of the option fields."""
    hints = typing.get_type_hints(ServerArgs)
    return {f.name: hints[f.name] for f in option_fields()}


def base_type(tp: Any) -> type:
    """The non-None type of an annotation such as `int | None`."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0]
    return typing.get_origin(tp) or tp


def coerce_value(name: str, value: Any) -> Any:
    """Check and convert one option value; raises `ConfigError` with the reason."""
    fields = {f.name: f for f in option_fields()}
    if name not in fields:
        raise ConfigError(f"unknown option (known: {', '.join(sorted(fields))})", key=name)
    f = fields[name]
    spec, tp = spec_of(f), field_types()[name]
    optional = type(None) in typing.get_args(tp)
    want = base_type(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError("may not be empty", key=name)
    if spec.parse is not None:
        try:
            value = spec.parse(value)
        except ValueError as e:
            raise ConfigError(str(e), key=name) from None
    if want is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"expected true or false, got {value!r}", key=name)
    elif want is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"expected an integer, got {value!r}", key=name)
    elif want is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"expected a number, got {value!r}", key=name)
        value = float(value)
    elif want is str:
        if not isinstance(value, str):
            raise ConfigError(f"expected a string, got {value!r}", key=name)
    elif want is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"expected a table/JSON object, got {value!r}", key=name)
    if spec.choices is not None and value not in spec.choices:
        raise ConfigError(f"{value!r} is not one of {', '.join(spec.choices)}", key=name)
    if spec.minimum is not None and (
        value < spec.minimum or (spec.exclusive_minimum and value == spec.minimum)
    ):
        op = ">" if spec.exclusive_minimum else ">="
        raise ConfigError(f"{value!r} is out of range (must be {op} {spec.minimum:g})", key=name)
    if spec.maximum is not None and value > spec.maximum:
        raise ConfigError(f"{value!r} is out of range (must be <= {spec.maximum:g})", key=name)
    return value


def coerce_values(
    values: Mapping[str, Any],
    *,
    source: str | None = None,
    key_names: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Check and convert option values from one source (a recipe, the command line).

    `key_names` maps option names to how the source spells them (`[cache] page_size`,
    `--page-size`) so an error points at what the user wrote.
    """
    clean: dict[str, Any] = {}
    for name, value in values.items():
        try:
            clean[name] = coerce_value(name, value)
        except ConfigError as e:
            key = (key_names or {}).get(name, name)
            raise ConfigError(e.reason, key=key, source=source) from None
    return clean


def build_server_args(values: Mapping[str, Any], *, source: str | None = None) -> ServerArgs:
    """A validated `ServerArgs` from defaults overlaid with `values` (option name -> value)."""
    clean = coerce_values(values, source=source)
    args = ServerArgs(**clean)
    try:
        args.validate()
    except ConfigError as e:
        raise ConfigError(e.reason, key=e.key, source=source) from None
    return args


def resolve_server_args(
    recipe: str | Path | None = None, overrides: Mapping[str, Any] | None = None
) -> ServerArgs:
    """Defaults < recipe TOML < `overrides` (the command line), validated as a whole."""
    from tokenspeed.runtime.recipes import load_recipe

    values: dict[str, Any] = {}
    sources = []
    if recipe is not None:
        loaded = load_recipe(recipe)
        values.update(loaded.options)
        sources.append(str(loaded.path))
    if overrides:
        flags = {name: "--" + name.replace("_", "-") for name in overrides}
        values.update(coerce_values(overrides, source="command line", key_names=flags))
        sources.append("command line")
    return build_server_args(values, source=" + ".join(sources) or None)
