"""Showing and saving results: a rich summary table and the result JSON file."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tokenspeed_cli.bench.errors import BenchError
from tokenspeed_cli.bench.metrics import LATENCIES, PERCENTILES

_TITLES = {
    "ttft": "Time to first token",
    "tpot": "Time per output token (excl. 1st)",
    "itl": "Inter-token latency",
    "e2el": "End-to-end latency",
}


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def serving_table(result: dict[str, Any]) -> Table:
    """vLLM's "Serving Benchmark Result" block as a two-column table."""
    table = Table(title="Serving benchmark result", title_justify="left", show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")

    def row(label: str, key: str, digits: int = 2) -> None:
        table.add_row(label, _fmt(result.get(key), digits))

    row("Successful requests", "completed")
    row("Failed requests", "failed")
    row("Benchmark duration (s)", "duration")
    row("Total input tokens", "total_input_tokens")
    row("Total generated tokens", "total_output_tokens")
    row("Request throughput (req/s)", "request_throughput")
    if result.get("request_goodput") is not None:
        row("Request goodput (req/s)", "request_goodput")
    row("Output token throughput (tok/s)", "output_throughput")
    row("Total token throughput (tok/s)", "total_token_throughput")
    rate = result.get("prefix_cache_hit_rate")
    table.add_row("Prefix cache hit rate", "n/a" if rate is None else f"{rate:.1%}")
    if result.get("max_concurrent_requests") is not None:
        row("Peak concurrent requests", "max_concurrent_requests")
    for name in LATENCIES:
        table.add_section()
        table.add_row(f"[cyan]{_TITLES[name]}[/]", "")
        row(f"Mean {name.upper()} (ms)", f"mean_{name}_ms")
        row(f"Median {name.upper()} (ms)", f"median_{name}_ms")
        for p in PERCENTILES:
            row(f"P{p} {name.upper()} (ms)", f"p{p}_{name}_ms")
    return table


def offline_table(result: dict[str, Any]) -> Table:
    """Offline throughput plus the engine's own per-request averages when it reported them."""
    table = Table(title="Offline benchmark result", title_justify="left", show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    rows = [
        ("Requests", "num_prompts"),
        ("Elapsed (s)", "elapsed_s"),
        ("Total input tokens", "total_input_tokens"),
        ("Total generated tokens", "total_output_tokens"),
        ("Request throughput (req/s)", "request_throughput"),
        ("Output token throughput (tok/s)", "output_throughput"),
        ("Total token throughput (tok/s)", "total_token_throughput"),
    ]
    for label, key in rows:
        table.add_row(label, _fmt(result.get(key)))
    engine = result.get("engine_stats") or {}
    if engine:
        table.add_section()
        table.add_row("[cyan]Engine per-request stats (mean)[/]", "")
        for key, value in engine.items():
            table.add_row(key, _fmt(value))
    return table


def print_table(console: Console, table: Table) -> None:
    """Print with a blank line before, so the table stands apart from the progress bar."""
    console.print()
    console.print(table)


def save_result(path: Path, result: dict[str, Any]) -> None:
    """Write the result JSON (indent 2); a path that cannot be written is a `BenchError`."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
    except OSError as e:
        raise BenchError(f"cannot write {path}: {e.strerror or e}") from None
