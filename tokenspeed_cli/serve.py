"""`tokenspeed serve`: resolve the configuration (defaults < recipe < flags) and serve it.

The server itself lives in `tokenspeed.runtime.entrypoints` (HTTP in this process, the engine
in a child process); this module only resolves options and reports to the terminal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from tokenspeed.runtime.config import ConfigError, ServerArgs, resolve_server_args
from tokenspeed.runtime.recipes import save_recipe as write_recipe
from tokenspeed_cli.config_view import print_config
from tokenspeed_cli.console import console, err_console, fail
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
    raise typer.Exit(start_server(args))


def start_server(args: ServerArgs) -> int:
    """Run the server in the foreground; the exit code is 0 after a signal, 1 if the engine died."""
    import asyncio
    import logging

    from tokenspeed.runtime.entrypoints.launch import ServerStartError, run_server

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    console.print(config_summary(args), highlight=False, soft_wrap=True)
    try:
        return asyncio.run(run_server(args, on_ready=_print_ready, on_status=_print_status))
    except ServerStartError as e:
        fail(str(e), code=1)
    except (KeyboardInterrupt, asyncio.CancelledError):
        err_console.print("interrupted while starting; the engine was stopped", highlight=False)
        return 130


def config_summary(args: ServerArgs) -> str:
    """The options that differ from the defaults, on one line (the full table is --dry-run)."""
    defaults = ServerArgs()
    changed = [
        f"{name}={value!r}"
        for name, value in args.to_dict().items()
        if value != getattr(defaults, name)
    ]
    model = args.model or "embedded tiny model"
    return f"tokenspeed serve: {model}; " + (", ".join(changed) if changed else "all defaults")


def _print_status(message: str) -> None:
    console.print(f"[dim]{message}[/]", highlight=False)


def _print_ready(state: Any, url: str) -> None:
    info = state.engine_info
    kv = info["kv_capacity"]
    console.print(
        f"engine ready in {info.get('startup_s', 0):.1f} s: model {state.model_name!r} on "
        f"{info['device']} ({info['dtype']}), max_model_len {info['max_model_len']}",
        highlight=False,
        soft_wrap=True,
    )
    host = f", host tier {kv['host_pages']} pages" if kv.get("host_pages") else ""
    console.print(
        f"KV cache: {kv['device_pages']} pages x {kv['page_size']} tokens = "
        f"{kv['device_tokens']} tokens{host}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(
        f"[bold green]serving[/] OpenAI-compatible API at {url}/v1", highlight=False, soft_wrap=True
    )
