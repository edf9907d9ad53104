"""``tokenspeed top``: attach the live dashboard to a running server.

Registered on the main app as ``app.command("top")(top)``. The first snapshot is fetched before
the dashboard opens, so a wrong URL or a server that is not there ends with one line and a
non-zero exit instead of an empty screen.
"""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["top"]


def top(
    url: Annotated[
        str, typer.Option(help="The server to watch (`tokenspeed serve` address).")
    ] = "http://127.0.0.1:8000",
    interval: Annotated[
        float, typer.Option(min=0.1, max=10.0, help="Seconds between updates.")
    ] = 0.5,
) -> None:
    """Live dashboard of a running server: requests, KV pages, throughput, latency, kernels.

    Keys: q quit, p pause, s change sort, / filter requests by id (Esc clears).
    """
    from tokenspeed_cli.console import fail
    from tokenspeed_cli.top.client import StatsError, fetch_snapshot, normalize_url
    from tokenspeed_cli.top.model import SnapshotError, view_from_snapshot

    try:
        base = normalize_url(url)
        first = fetch_snapshot(base)
        view_from_snapshot(first)  # refuse a document we cannot show, before opening
    except (StatsError, SnapshotError) as e:
        fail(str(e), code=1)
    from tokenspeed_cli.top.app import TopApp

    code = TopApp(base, interval, first=first).run()
    raise typer.Exit(code or 0)
