"""The `tokenspeed` command: one Typer app, one module per subcommand.

A subcommand is registered here only once it works end to end.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import typer

from tokenspeed_cli import bench, recipes, serve
from tokenspeed_cli.inspect_cache import inspect_cache
from tokenspeed_cli.kv_events.cli import replay_kv_events
from tokenspeed_cli.top import top
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
app.add_typer(bench.app, name="bench")
app.command("top")(top)
app.command("inspect-cache")(inspect_cache)
app.command("replay-kv-events")(replay_kv_events)
app.command("tune-kernels")(tune_kernels)
app.command("serve")(serve.serve)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
