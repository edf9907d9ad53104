"""The Textual app on a fixed snapshot (no server: the feed fails and keeps retrying)."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from textual.widgets import DataTable, Input, Sparkline  # noqa: E402
from top_snapshots import snapshot  # noqa: E402

from tokenspeed_cli.top.app import TopApp  # noqa: E402
from tokenspeed_cli.top.model import Backoff  # noqa: E402
from tokenspeed_cli.top.widgets import PageBar  # noqa: E402


def _closed_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _ids(app: TopApp) -> list[str]:
    table = app.query_one("#requests", DataTable)
    return [str(table.get_row_at(i)[0]) for i in range(table.row_count)]


def test_app_draws_the_snapshot_and_keys_work() -> None:
    async def main() -> None:
        app = TopApp(_closed_url(), 0.2, first=snapshot(), backoff=Backoff(0.1, 0.2))
        async with app.run_test(size=(150, 45)) as pilot:
            await pilot.pause(0.3)
            assert "tiny-test" in app.header_line and "TP4 DP2 EP" in app.header_line
            assert "up 01:02:03" in app.header_line
            device = app.query_one("#device-bar", PageBar)
            host = app.query_one("#host-bar", PageBar)
            assert (device.tier.total, device.tier.active, device.tier.free) == (200, 50, 120)
            assert host.tier.total == 50
            assert "device: 200 pages" in str(device.render())
            assert app.query_one("#tput-spark", Sparkline).data == [1750.5]
            assert app.query_one("#kernels", DataTable).row_count == 2
            # Default sort: oldest first.
            assert _ids(app) == ["cmpl-bbb-0-0", "chatcmpl-aaa-0-0", "cmpl-ccc-0-1"]
            await pilot.press("s")  # -> id
            assert _ids(app) == ["chatcmpl-aaa-0-0", "cmpl-bbb-0-0", "cmpl-ccc-0-1"]
            assert "sort id ▲" in app.status_line
            await pilot.press("slash")
            assert isinstance(app.focused, Input)
            await pilot.press("c", "c", "c")
            assert _ids(app) == ["cmpl-ccc-0-1"] and "filter 'ccc'" in app.status_line
            await pilot.press("q")  # typed into the filter, not a quit
            assert app.is_running and _ids(app) == []
            await pilot.press("escape")
            assert len(_ids(app)) == 3 and app.filter_text == ""
            await pilot.press("p")
            assert app.paused and "PAUSED" in app.header_line
            app.receive(snapshot(seq=8, requests=[], num_requests=0))
            assert len(_ids(app)) == 3 and app.shown is not None and app.shown.seq == 7
            await pilot.press("p")
            assert _ids(app) == [] and app.shown.seq == 8
            # Nothing listens at the URL: the header says so and the feed keeps retrying.
            for _ in range(50):
                if "disconnected — retrying" in app.header_line:
                    break
                await pilot.pause(0.1)
            assert "disconnected — retrying" in app.header_line
            assert "cannot connect" in app.header_line
            await pilot.press("q")
        assert app.return_code == 0

    asyncio.run(main())
