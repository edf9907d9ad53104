"""The `tokenspeed` command: help lists only working subcommands; serve's config flags."""

import json
import subprocess
import sys

import typer
from typer.testing import CliRunner

from tokenspeed.runtime.recipes import load_recipe
from tokenspeed_cli.main import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.startswith("tokenspeed 0.")


def test_help_lists_exactly_the_working_subcommands():
    result = invoke("--help")
    assert result.exit_code == 0
    group = typer.main.get_command(app)
    listed = {name for name, command in group.commands.items() if not command.hidden}
    assert listed == {
        "serve",
        "bench",
        "top",
        "tune-kernels",
        "inspect-cache",
        "replay-kv-events",
        "recipes",
    }
    for name in listed:
        assert name in result.stdout
        # Every advertised command is wired to real code: its own help renders.
        assert invoke(name, "--help").exit_code == 0, name


def test_recipes_list_shows_every_recipe_with_description():
    result = invoke("recipes", "list")
    assert result.exit_code == 0
    for name in ("tiny", "qwen3-8b", "kimi-k25", "deepseek-v3", "gpt-oss-20b"):
        assert name in result.stdout


def test_recipes_show_json_is_the_resolved_configuration():
    result = invoke("recipes", "show", "qwen3-8b", "--json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["page_size"] == 64
    assert data["max_num_seqs"] == 256
    assert data["enable_prefix_caching"] is True  # default filled in


def test_recipes_validate_reports_each_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[cache]\npage_size = -1\n")
    result = invoke("recipes", "validate", "recipes/tiny.toml", str(bad))
    assert result.exit_code == 1
    assert "ok recipes/tiny.toml" in result.stdout
    assert "page_size" in result.stderr and "out of range" in result.stderr


def test_serve_dry_run_prints_the_resolved_configuration():
    result = invoke(
        "serve", "--recipe", "tiny", "--page-size", "32", "--no-enable-prefix-caching", "--dry-run"
    )
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "page_size" in out and "32" in out
    assert "enable_prefix_caching" in out and "False" in out
    assert "chunked_prefill_size" in out and "2048" in out  # from the recipe


def test_serve_save_recipe_round_trips_flags(tmp_path):
    saved = tmp_path / "saved.toml"
    result = invoke(
        "serve",
        "qwen3-8b",
        "--load-format",
        "dummy",
        "--hf-overrides",
        '{"num_hidden_layers": 2}',
        "--max-num-seqs",
        "7",
        "--save-recipe",
        str(saved),
    )
    assert result.exit_code == 0, result.stderr
    options = load_recipe(saved).options
    assert options["model"] == "qwen3-8b"
    assert options["hf_overrides"] == {"num_hidden_layers": 2}
    assert options["max_num_seqs"] == 7


def test_serve_bad_flag_is_one_clear_error():
    result = invoke("serve", "--gpu-memory-utilization", "2", "--dry-run")
    assert result.exit_code == 2
    assert "--gpu-memory-utilization" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_serve_refuses_what_this_build_cannot_honour():
    result = invoke("serve", "--recipe", "kimi-k25")
    assert result.exit_code == 2
    assert "tensor_parallel_size=8" in result.stderr


def test_console_script_is_installed():
    out = subprocess.run(
        [sys.executable, "-m", "tokenspeed_cli.main", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.startswith("tokenspeed ")
