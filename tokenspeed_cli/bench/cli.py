"""The `tokenspeed bench` Typer app (in a submodule so it imports even where an editable
install predates this package's ``__init__``)."""

from __future__ import annotations

import typer

from tokenspeed_cli.bench.offline import bench_offline
from tokenspeed_cli.bench.serve_cmd import bench_serve

app = typer.Typer(
    help="Benchmark a running server (serve) or the engine in this process (offline).",
    no_args_is_help=True,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
)
app.command("serve")(bench_serve)
app.command("offline")(bench_offline)
