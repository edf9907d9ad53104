"""`tokenspeed serve`: resolve the configuration (defaults < recipe < flags) and serve it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from tokenspeed.runtime.config import ConfigError, ServerArgs, resolve_server_args
from tokenspeed.runtime.recipes import save_recipe as write_recipe
from tokenspeed_cli.config_view import print_config
from tokenspeed_cli.console import console, fail
from tokenspeed_cli.server_flags import server_args_command


def resolve_from_cli(
    model_arg: str | None, recipe: str | None, overrides: dict[str, Any]
) -> ServerArgs:
    """Fold the positional MODEL into the flags and resolve; a bad value is one clear error."""
    if model_arg is not None:
        if "model" in overrides and overrides["model"] != model_arg:
            fail(f"the model is given twice: {model_arg!r} and --model {overrides['model']!r}")
        overrides = {**overrides, "model": model_arg}
    try:
        return resolve_server_args(recipe, overrides)
    except ConfigError as e:
        fail(str(e))


@server_args_command
def serve(
    model_arg: str | None = typer.Argument(
        None,
        metavar="MODEL",
        help="Model directory or shipped architecture name (default: the embedded tiny model).",
    ),
    recipe: str | None = typer.Option(
        None,
        "--recipe",
        "-r",
        metavar="NAME|FILE",
        help="Recipe whose options sit under the flags.",
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the resolved configuration and exit."
    ),
    save_recipe: Path | None = typer.Option(
        None,
        "--save-recipe",
        metavar="FILE",
        help="Write the resolved configuration as a recipe (TOML) and exit.",
    ),
    *,
    overrides: dict[str, Any],
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API."""
    args = resolve_from_cli(model_arg, recipe, overrides)
    if save_recipe is not None:
        write_recipe(args, save_recipe)
        console.print(f"wrote {save_recipe}", highlight=False)
    if dry_run:
        print_config(args, "Resolved configuration (defaults < recipe < flags)")
    if dry_run or save_recipe is not None:
        return
    unsupported = args.unsupported_options()
    if unsupported:
        fail("this build cannot honour: " + "; ".join(unsupported))
    fail(
        "the HTTP server is not part of this build yet (it lands with the serving work); "
        "`tokenspeed serve --dry-run` shows the configuration it would run",
        code=3,
    )
