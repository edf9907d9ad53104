"""`tokenspeed recipes`: list, show and validate deployment recipes."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from tokenspeed.runtime.config import ConfigError, build_server_args
from tokenspeed.runtime.recipes import load_recipe, recipe_toml, shipped_recipes
from tokenspeed_cli.config_view import print_config
from tokenspeed_cli.console import console, err_console, fail

app = typer.Typer(
    help="List, show and validate deployment recipes (config as code).", no_args_is_help=True
)


@app.command("list")
def list_recipes() -> None:
    """The recipes that ship with TokenSpeed, one line each."""
    table = Table(title="Shipped recipes", title_justify="left")
    table.add_column("name", style="bold")
    table.add_column("model")
    table.add_column("description")
    for recipe in shipped_recipes():
        table.add_row(
            recipe.name,
            str(recipe.options.get("model", "(embedded tiny model)")),
            recipe.description,
        )
    console.print(table)


@app.command("show")
def show(
    recipe: str = typer.Argument(..., metavar="NAME|FILE", help="Shipped recipe name or file."),
    as_json: bool = typer.Option(False, "--json", help="Print the options as JSON."),
    as_toml: bool = typer.Option(False, "--toml", help="Print the resolved recipe as TOML."),
) -> None:
    """The fully resolved configuration of a recipe (defaults filled in)."""
    try:
        loaded = load_recipe(recipe)
        args = build_server_args(loaded.options, source=str(loaded.path))
    except ConfigError as e:
        fail(str(e))
    if as_json:
        print(json.dumps(args.to_dict(), indent=2))
    elif as_toml:
        print(recipe_toml(args, description=loaded.description), end="")
    else:
        title = f"{loaded.name}: {loaded.description}" if loaded.description else loaded.name
        print_config(args, title)


@app.command("validate")
def validate(
    files: list[Path] = typer.Argument(..., metavar="FILE...", help="Recipe files to check."),
) -> None:
    """Check recipe files: known keys in the right tables, types, ranges, contradictions."""
    failed = 0
    for path in files:
        try:
            loaded = load_recipe(path)
            build_server_args(loaded.options, source=str(loaded.path))
        except ConfigError as e:
            err_console.print(f"[bold red]invalid[/] {e}", highlight=False, soft_wrap=True)
            failed += 1
        else:
            console.print(f"[green]ok[/] {path}", highlight=False)
    if failed:
        raise typer.Exit(1)
