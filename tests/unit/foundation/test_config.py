"""ServerArgs: types, ranges, contradictions, and defaults < recipe < flags."""

import textwrap

import pytest

from tokenspeed.runtime.config import (
    ConfigError,
    ServerArgs,
    build_server_args,
    parse_size,
    resolve_server_args,
)


def write(tmp_path, text, name="r.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_defaults_follow_vllm_and_tokenspeed_conventions():
    args = ServerArgs()
    assert args.chunked_prefill_size == 8192
    assert args.max_num_seqs == 256
    assert args.enable_prefix_caching is True
    assert args.gpu_memory_utilization == 0.9
    assert args.unsupported_options() == []


def test_precedence_defaults_then_recipe_then_flags(tmp_path):
    recipe = write(
        tmp_path,
        """
        [cache]
        page_size = 32
        [scheduler]
        max_num_seqs = 8
        chunked_prefill_size = 512
    """,
    )
    args = resolve_server_args(recipe, {"max_num_seqs": 4})
    assert args.page_size == 32  # recipe over default
    assert args.max_num_seqs == 4  # flag over recipe
    assert args.chunked_prefill_size == 512
    assert args.dtype == "auto"  # default kept


@pytest.mark.parametrize(
    ("values", "key", "reason"),
    [
        ({"page_size": 0}, "page_size", "out of range"),
        ({"page_size": "16"}, "page_size", "expected an integer"),
        ({"page_size": True}, "page_size", "expected an integer"),
        ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization", "must be > 0"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization", "must be <= 1"),
        ({"dtype": "fp64"}, "dtype", "is not one of"),
        ({"enable_prefix_caching": "yes"}, "enable_prefix_caching", "expected true or false"),
        ({"hf_overrides": "{not json"}, "hf_overrides", "not valid JSON"),
        ({"hf_overrides": "[1, 2]"}, "hf_overrides", "expected a JSON object"),
        ({"kv_cache_memory": "12 parsecs"}, "kv_cache_memory", "expected a size"),
        ({"no_such_option": 1}, "no_such_option", "unknown option"),
        ({"port": 70000}, "port", "out of range"),
    ],
)
def test_bad_values_name_the_key_and_reason(values, key, reason):
    with pytest.raises(ConfigError) as e:
        build_server_args(values, source="here")
    assert e.value.key == key
    assert reason in e.value.reason
    assert str(e.value).startswith(f"here: {key}: ")


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"world_size": 4, "tensor_parallel_size": 2}, "world_size"),
        ({"tensor_parallel_size": 4, "attn_tp_size": 3}, "attn_tp_size"),
        ({"tensor_parallel_size": 2, "data_parallel_size": 2, "moe_tp_size": 8}, "moe_tp_size"),
        ({"enable_expert_parallel": True}, "enable_expert_parallel"),
        ({"max_total_tokens": 4096, "kv_cache_memory": "1GiB"}, "kv_cache_memory"),
        ({"max_total_tokens": 8, "page_size": 16}, "max_total_tokens"),
    ],
)
def test_contradictions_are_rejected(values, key):
    with pytest.raises(ConfigError) as e:
        build_server_args(values)
    assert e.value.key == key


def test_consistent_parallel_layout_is_accepted():
    args = build_server_args(
        {
            "tensor_parallel_size": 4,
            "data_parallel_size": 2,
            "world_size": 8,
            "attn_tp_size": 4,
            "moe_tp_size": 1,
            "enable_expert_parallel": True,
        }
    )
    assert args.world_size == 8


def test_options_this_build_cannot_honour_are_named():
    args = build_server_args({"kv_cache_dtype": "fp8_e5m2", "speculative_algorithm": "EAGLE3"})
    unsupported = args.unsupported_options()
    assert any(line.startswith("kv_cache_dtype=") for line in unsupported)
    assert any(line.startswith("speculative_algorithm=") for line in unsupported)
    parsers = build_server_args({"reasoning_parser": "gpt-oss", "tool_call_parser": "mistral"})
    named = parsers.unsupported_options()
    assert any("reasoning_parser='gpt-oss'" in line and "qwen3" in line for line in named)
    assert any("tool_call_parser='mistral'" in line and "kimi_k2" in line for line in named)
    kimi = build_server_args({"reasoning_parser": "kimi_k2", "tool_call_parser": "kimi_k2"})
    assert kimi.unsupported_options() == []


def test_the_built_parser_names_are_the_parsers():
    """config names the parsers without importing them; the names must stay the same."""
    from tokenspeed.runtime.config import _BUILT_REASONING_PARSERS, _BUILT_TOOL_CALL_PARSERS
    from tokenspeed.runtime.parsers import REASONING_PARSERS, TOOL_CALL_PARSERS

    assert sorted(_BUILT_REASONING_PARSERS) == sorted(REASONING_PARSERS)
    assert sorted(_BUILT_TOOL_CALL_PARSERS) == sorted(TOOL_CALL_PARSERS)


def test_sizes_and_json_parse():
    assert parse_size("512MiB") == 512 * 1024**2
    assert parse_size("2GB") == 2 * 10**9
    assert parse_size(1234) == 1234
    args = build_server_args(
        {"hf_overrides": '{"num_hidden_layers": 2}', "kv_cache_memory": "1GiB"}
    )
    assert args.hf_overrides == {"num_hidden_layers": 2}
    assert args.kv_cache_memory == 1024**3


def test_command_line_errors_name_the_flag(tmp_path):
    with pytest.raises(ConfigError) as e:
        resolve_server_args(None, {"max_num_seqs": 0})
    assert str(e.value).startswith("command line: --max-num-seqs: ")
