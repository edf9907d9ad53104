"""The `tokenspeed` command: one Typer app, one module per subcommand.

A subcommand is registered here only once it works end to end.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import typer

from tokenspeed_cli import recipes, serve
from tokenspeed_cli.tune_kernels import tune_kernels

app = typer.Typer(
    name="tokenspeed",
    help="TokenSpeed: an LLM inference engine for agentic workloads.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    add_completion=False,
)


def package_version() -> str:
    try:
        return version("tokenspeed")
    except PackageNotFoundError:
        return "unknown"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"tokenspeed {package_version()}")
        raise typer.Exit()


@app.callback()
def root(
    show_version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the version and exit.",
    ),
) -> None:
    """TokenSpeed: an LLM inference engine for agentic workloads."""


app.add_typer(recipes.app, name="recipes")
app.command("tune-kernels")(tune_kernels)
# Hidden until the HTTP server lands: today it resolves, prints and saves configurations.
app.command("serve", hidden=True)(serve.serve)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
