"""The `tokenspeed top` Textual app: a live view of one server, fed by its stats stream.

One worker follows `/v1/stats/stream`; each snapshot is mapped to a `DashboardView` (model.py)
and drawn, unless paused. When the stream fails or ends the header says so and the worker
reconnects with backoff; the last numbers stay on screen meanwhile.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import httpx
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Footer, Input, Sparkline, Static

from tokenspeed_cli.top.client import StatsError, describe, iter_snapshots
from tokenspeed_cli.top.model import (
    COLUMNS,
    KERNEL_COLUMNS,
    SORT_KEYS,
    Backoff,
    Connection,
    DashboardView,
    History,
    KernelRow,
    RequestRow,
    SnapshotError,
    arrange_rows,
    connection_text,
    header_text,
    view_from_snapshot,
)
from tokenspeed_cli.top.widgets import PageBar


class TopApp(App[int]):
    """The dashboard: header, KV bars, sparklines, live requests, selected kernels."""

    TITLE = "tokenspeed top"
    AUTO_FOCUS = "#requests"
    CSS = """
    #header { height: 1; background: $primary-background; color: $text; text-style: bold;
              padding: 0 1; }
    #panels { height: 10; }
    .panel { border: round $primary; padding: 0 1; width: 1fr; }
    #sched { height: 2; }
    .label { height: 1; }
    Sparkline { height: 1; }
    #table-status { height: 1; padding: 0 1; color: $text-muted; }
    #filter { display: none; height: 3; }
    #filter.active { display: block; }
    #requests { height: 1fr; }
    #kernels { height: 8; border-top: solid $primary; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit_app", "Quit"),
        Binding("p", "toggle_pause", "Pause"),
        Binding("s", "cycle_sort", "Sort"),
        Binding("slash", "start_filter", "Filter"),
        Binding("escape", "end_filter", "Clear filter", show=False),
    ]

    def __init__(
        self,
        url: str,
        interval: float = 0.5,
        first: dict[str, Any] | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        super().__init__()
        self.url = url
        self.interval = interval
        self.backoff = backoff or Backoff()
        self.history = History()
        self.paused = False
        self.sort_index = 0
        self.filter_text = ""
        self.connection = Connection.CONNECTING
        self.connection_label = connection_text(Connection.CONNECTING)
        self.latest: DashboardView | None = None  # newest snapshot received
        self.shown: DashboardView | None = None  # what is on screen (frozen while paused)
        self.shown_rows: list[RequestRow] = []
        self.snapshots_received = 0
        self.header_line = ""  # the header's text, as drawn
        self.status_line = ""  # the line above the requests table, as drawn
        self._kernels_shown: tuple[KernelRow, ...] | None = None
        self._first = first

    # ---- layout -------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static(id="header")
        with Horizontal(id="panels"):
            with Vertical(classes="panel", id="kv-panel") as kv:
                kv.border_title = "KV pages (active │ cached │ free)"
                yield PageBar("device", id="device-bar")
                yield PageBar("host", id="host-bar")
                yield Static(id="sched")
            with Vertical(classes="panel", id="perf-panel") as perf:
                perf.border_title = "throughput · latency"
                yield Static(id="tput-label", classes="label")
                yield Sparkline([], id="tput-spark", summary_function=max)
                yield Static(id="ttft-label", classes="label")
                yield Sparkline([], id="ttft-spark", summary_function=max)
                yield Static(id="itl-label", classes="label")
                yield Sparkline([], id="itl-spark", summary_function=max)
        yield Static(id="table-status")
        yield Input(placeholder="filter requests by id (Enter: keep, Esc: clear)", id="filter")
        yield DataTable(id="requests", cursor_type="row", zebra_stripes=True)
        yield DataTable(id="kernels", cursor_type="none", show_cursor=False)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#requests", DataTable).add_columns(*COLUMNS)
        self.query_one("#kernels", DataTable).add_columns(*KERNEL_COLUMNS)
        if self._first is not None:
            self.connection, self.connection_label = Connection.CONNECTED, "connected"
            self.receive(self._first)
        self._draw_header()
        self.run_worker(self._follow(), name="stats-stream", group="stream", exclusive=True)

    # ---- the feed -----------------------------------------------------------------------
    async def _follow(self) -> None:
        """Follow the stream forever; on failure show why, wait (backoff) and reconnect."""
        async with httpx.AsyncClient() as client:
            while True:
                try:
                    async for snap in iter_snapshots(client, self.url, self.interval):
                        if self.connection is not Connection.CONNECTED:
                            self.backoff.reset()
                            self.set_connection(Connection.CONNECTED)
                        self.receive(snap)
                    reason = "the stream ended"
                except (httpx.HTTPError, StatsError, SnapshotError) as e:
                    reason = describe(e, self.url)
                delay = self.backoff.next()
                self.set_connection(Connection.DISCONNECTED, delay, reason)
                await asyncio.sleep(delay)
                self.set_connection(Connection.CONNECTING)

    def set_connection(self, state: Connection, retry_in: float | None = None,
                       reason: str = "") -> None:  # fmt: skip
        """Record and show the connection state (shown even while paused)."""
        self.connection = state
        self.connection_label = connection_text(state, retry_in, reason)
        self._draw_header()

    def receive(self, snap: dict[str, Any]) -> None:
        """Take one snapshot: keep it and its history; draw it unless paused."""
        view = view_from_snapshot(snap)
        self.snapshots_received += 1
        self.latest = view
        self.history.push(view)
        if not self.paused:
            self.show(view)

    # ---- drawing ------------------------------------------------------------------------
    def show(self, view: DashboardView) -> None:
        """Put one view on screen."""
        self.shown = view
        self._draw_header()
        self.query_one("#device-bar", PageBar).set_tier(view.device_tier)
        self.query_one("#host-bar", PageBar).set_tier(view.host_tier)
        self.query_one("#sched", Static).update(view.scheduler_line())
        self.query_one("#tput-label", Static).update(view.throughput_line())
        self.query_one("#ttft-label", Static).update(view.ttft_line())
        self.query_one("#itl-label", Static).update(view.itl_line())
        self.query_one("#tput-spark", Sparkline).data = self.history.values("throughput")
        self.query_one("#ttft-spark", Sparkline).data = self.history.values("ttft")
        self.query_one("#itl-spark", Sparkline).data = self.history.values("itl")
        self._draw_requests()
        if view.kernels != self._kernels_shown:
            self._kernels_shown = view.kernels
            table = self.query_one("#kernels", DataTable)
            table.clear()
            for k in view.kernels:
                table.add_row(*k.cells())

    def _draw_header(self) -> None:
        text = header_text(self.shown, self.url, self.connection_label, self.paused)
        self.header_line = text
        self.query_one("#header", Static).update(text)

    def _draw_requests(self) -> None:
        view = self.shown
        table = self.query_one("#requests", DataTable)
        rows = list(view.requests) if view is not None else []
        sort = SORT_KEYS[self.sort_index]
        self.shown_rows = arrange_rows(rows, sort, self.filter_text)
        selected = None
        if table.row_count and 0 <= table.cursor_row < table.row_count:
            selected = table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value
        table.clear()
        for row in self.shown_rows:
            table.add_row(*row.cells(), key=row.id)
        ids = [r.id for r in self.shown_rows]
        if selected in ids:
            table.move_cursor(row=ids.index(selected), animate=False)
        total = view.num_requests if view is not None else 0
        status = f"{total} live requests"
        if len(rows) < total:
            status += f" ({len(rows)} sent)"
        if self.filter_text:
            status += f" · filter {self.filter_text!r}: {len(self.shown_rows)} shown"
        status += f" · sort {sort.label()}"
        self.status_line = status
        self.query_one("#table-status", Static).update(status)

    # ---- keys ---------------------------------------------------------------------------
    def action_quit_app(self) -> None:
        """q: leave with exit code 0."""
        self.exit(0)

    def action_toggle_pause(self) -> None:
        """p: freeze the screen (the feed keeps running); again: jump to the newest numbers."""
        self.paused = not self.paused
        if not self.paused and self.latest is not None:
            self.show(self.latest)
        self._draw_header()

    def action_cycle_sort(self) -> None:
        """s: sort the requests table by the next column."""
        self.sort_index = (self.sort_index + 1) % len(SORT_KEYS)
        self._draw_requests()

    def action_start_filter(self) -> None:
        """/: open the id filter."""
        box = self.query_one("#filter", Input)
        box.add_class("active")
        box.focus()

    def action_end_filter(self) -> None:
        """Esc: clear and close the filter."""
        box = self.query_one("#filter", Input)
        box.value = ""
        box.remove_class("active")
        self.filter_text = ""
        self._draw_requests()
        self.query_one("#requests", DataTable).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        """Filter as you type."""
        if event.input.id == "filter":
            self.filter_text = event.value
            self._draw_requests()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter: keep the filter, back to the table (the box stays while it filters)."""
        if event.input.id == "filter":
            if not event.value:
                event.input.remove_class("active")
            self.query_one("#requests", DataTable).focus()
