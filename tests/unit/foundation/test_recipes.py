"""Recipes: every class of error names file, key and reason; shipped recipes are valid."""

import textwrap

import pytest

from tokenspeed.runtime.config import ConfigError, ServerArgs, build_server_args, option_fields
from tokenspeed.runtime.recipes import (
    load_recipe,
    recipe_toml,
    recipes_dir,
    save_recipe,
    shipped_recipes,
)

EXPECTED = {"tiny", "qwen3-8b", "qwen3-30b-a3b", "deepseek-v3", "kimi-k25", "gpt-oss-20b"}


def write(tmp_path, text):
    path = tmp_path / "recipe.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_shipped_recipes_are_all_valid_and_described():
    recipes = {r.name: r for r in shipped_recipes()}
    assert EXPECTED <= set(recipes)
    for recipe in recipes.values():
        assert recipe.description
        build_server_args(recipe.options, source=str(recipe.path))
        header = recipe.path.read_text().splitlines()[0]
        assert header.startswith("#"), f"{recipe.name} lacks a comment header"


def test_tiny_recipe_serves_the_embedded_model_with_nothing_unsupported():
    recipe = load_recipe("tiny")
    args = build_server_args(recipe.options)
    assert args.model is None
    assert args.unsupported_options() == []


@pytest.mark.parametrize("name", ["qwen3-8b", "qwen3-30b-a3b"])
def test_single_gpu_qwen3_recipes_ask_for_nothing_unbuilt(name):
    """Their reasoning (qwen3) and tool-call (qwen25) parsers are built, so they serve."""
    args = build_server_args(load_recipe(name).options)
    assert (args.reasoning_parser, args.tool_call_parser) == ("qwen3", "qwen25")
    assert args.unsupported_options() == []


def test_large_recipes_name_what_this_build_cannot_run():
    args = build_server_args(load_recipe("kimi-k25").options)
    assert args.tensor_parallel_size == 8
    assert args.unsupported_options()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[cache]\npage_size = 0\n", "[cache] page_size: 0 is out of range"),
        ("[cache]\npage_size = 'big'\n", "[cache] page_size: expected an integer"),
        ("[cache]\nno_such = 1\n", "[cache] no_such: unknown option in [cache]"),
        ("[scheduler]\npage_size = 16\n", "[scheduler] page_size: belongs in [cache]"),
        ("[nonsense]\nx = 1\n", "nonsense: unknown table"),
        ("page_size = 16\n", "page_size: options belong in their group's table"),
        ("[cache\n", "not valid TOML"),
        ("description = 3\n", "description: expected a string"),
    ],
)
def test_every_class_of_recipe_error(tmp_path, text, fragment):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_recipe(path)
    message = str(e.value)
    assert message.startswith(str(path)), message
    assert fragment in message


def test_contradiction_in_recipe_names_the_file(tmp_path):
    path = write(tmp_path, "[parallel]\ntensor_parallel_size = 2\nworld_size = 3\n")
    recipe = load_recipe(path)
    with pytest.raises(ConfigError) as e:
        build_server_args(recipe.options, source=str(recipe.path))
    assert str(e.value).startswith(f"{path}: world_size: ")


def test_missing_recipe_lists_the_shipped_ones():
    with pytest.raises(ConfigError) as e:
        load_recipe("no-such-recipe")
    assert "tiny" in str(e.value)


def test_save_recipe_round_trips_every_option(tmp_path):
    args = build_server_args(
        {
            "model": "qwen3-8b",
            "load_format": "dummy",
            "page_size": 64,
            "hf_overrides": {"num_hidden_layers": 2},
            "enable_prefix_caching": False,
            "gpu_memory_utilization": 0.5,
            "kv_cache_memory": "256MiB",
        }
    )
    path = save_recipe(args, tmp_path / "saved.toml", description="round trip")
    loaded = load_recipe(path)
    again = build_server_args(loaded.options)
    assert again == args
    assert loaded.description == "round trip"
    # Every option is written (those that are not None), so the file is complete.
    assert set(loaded.options) == {
        f.name for f in option_fields() if getattr(args, f.name) is not None
    }


def test_only_changed_toml_is_minimal():
    text = recipe_toml(ServerArgs(page_size=32), only_changed=True)
    assert text.strip() == "[cache]\npage_size = 32"


def test_recipes_dir_is_the_repository_folder():
    assert (recipes_dir() / "tiny.toml").is_file()
