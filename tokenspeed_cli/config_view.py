"""Rendering a resolved `ServerArgs` for people (`--dry-run`, `recipes show`)."""

from __future__ import annotations

from rich.table import Table

from tokenspeed.runtime.config import GROUPS, ServerArgs, option_fields, spec_of
from tokenspeed_cli.console import console


def config_table(args: ServerArgs, title: str) -> Table:
    """One row per option, grouped; values that differ from the default are highlighted."""
    defaults = ServerArgs()
    table = Table(title=title, title_justify="left", show_lines=False)
    table.add_column("group", style="dim")
    table.add_column("option")
    table.add_column("value")
    for group, label in GROUPS.items():
        first = True
        for f in option_fields():
            if spec_of(f).group != group:
                continue
            value = getattr(args, f.name)
            changed = value != getattr(defaults, f.name)
            shown = "-" if value is None else repr(value) if isinstance(value, str) else str(value)
            table.add_row(
                label if first else "", f.name, f"[bold cyan]{shown}[/]" if changed else shown
            )
            first = False
    return table


def print_config(args: ServerArgs, title: str) -> None:
    """The table, then what this build cannot honour in it."""
    console.print(config_table(args, title))
    unsupported = args.unsupported_options()
    if unsupported:
        console.print("[yellow]Not available in this build (serve refuses these):[/]")
        for line in unsupported:
            console.print(f"  [yellow]-[/] {line}", highlight=False)
