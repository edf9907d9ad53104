"""`tokenspeed top` against a real tiny-model server: the stats feed, the dashboard, failures.

The dashboard runs headless under Textual's Pilot while background threads stream completions;
the assertions compare what the widgets show with what the server reports elsewhere
(`/get_server_info`, `usage`). One test kills its own server and starts another on the same
port to see the dashboard say so and reconnect.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving_helpers import MODEL, REPO_ROOT, Server, free_port, scheduler_built, start_server
from textual.widgets import DataTable, Input

from tokenspeed_cli.top.app import TopApp
from tokenspeed_cli.top.client import SSEParser, fetch_snapshot
from tokenspeed_cli.top.model import Backoff
from tokenspeed_cli.top.widgets import PageBar

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not scheduler_built(), reason="the C++ scheduler is not built"),
]

FLAGS = ("--max-total-tokens", "4096", "--max-model-len", "1024", "--host-kv-cache-memory", "8MiB")
PROMPT = "Operators watch the dashboard while the agents keep sending tool output. " * 2
# Runs `top` the way the CLI registers it (`app.command("top")(top)`), without the frame.
TOP_CLI = (
    "import typer; from tokenspeed_cli.top import top; a = typer.Typer(); a.command()(top); a()"
)


@pytest.fixture(scope="module")
def top_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The module's server: tiny model, small device pool and a host tier."""
    srv = start_server(tmp_path_factory.mktemp("top"), *FLAGS)
    yield srv
    srv.stop()


class Load:
    """Background threads that keep `n` streaming completions running until closed. Thread
    `i` asks for `max_tokens + 40 i` tokens: requests of one length admitted together would
    also finish together, and the server would be empty until the next ones arrive."""

    def __init__(self, url: str, n: int = 3, max_tokens: int = 300) -> None:
        self.url = url
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.threads = [
            threading.Thread(target=self._run, args=(max_tokens + 40 * i,), daemon=True)
            for i in range(n)
        ]

    def _run(self, max_tokens: int) -> None:
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens,
                "ignore_eos": True, "stream": True}  # fmt: skip
        while not self.stop.is_set():
            try:
                with httpx.stream("POST", f"{self.url}/v1/completions", json=body,
                                  timeout=120) as r:  # fmt: skip
                    for _ in r.iter_lines():
                        if self.stop.is_set():
                            return  # leaving the stream closes it: the server aborts it
            except httpx.HTTPError as e:
                if not self.stop.is_set():
                    self.errors.append(repr(e))
                    time.sleep(0.2)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


async def _freeze_with_rows(pilot: Any, table: DataTable, rows: int, tries: int = 20) -> bool:
    """Pause the dashboard (`p`) on a screen that shows at least `rows` requests: the load's
    requests are replaced as they finish, so the snapshot frozen can fall in between."""
    for _ in range(tries):
        await _until(pilot, lambda: table.row_count >= rows)
        await pilot.press("p")
        if table.row_count >= rows:
            return True
        await pilot.press("p")  # an empty moment was frozen: resume and try again
    return False


async def _until(pilot: Any, cond: Callable[[], bool], timeout: float = 60.0) -> bool:
    """Let the app run until `cond()` holds (True) or `timeout` passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        await pilot.pause(0.1)
    return cond()


def _prompt_tokens(url: str) -> int:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1}
    return int(httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["usage"]
               ["prompt_tokens"])  # fmt: skip


# ---- the feed ---------------------------------------------------------------------------------
def test_snapshot_reports_the_servers_own_numbers(top_server: Server) -> None:
    info = httpx.get(f"{top_server.url}/get_server_info", timeout=10).json()
    snap = httpx.get(f"{top_server.url}/v1/stats", timeout=10).json()
    cap = info["kv_capacity"]
    assert snap["version"] == 1 and snap["engine"]["alive"]
    assert snap["server"]["model"] == info["model"] == MODEL
    assert snap["server"]["kv_capacity"] == cap
    assert snap["kv"]["device"]["total"] == cap["device_pages"] > 0
    assert snap["kv"]["host"]["total"] == cap["host_pages"] > 0
    for tier in ("device", "host"):
        t = snap["kv"][tier]
        assert t["free"] + t["active"] + t["cached"] == t["total"]
    assert snap["server"]["layout"]["text"] == "TP1 DP1"
    assert snap["server"]["max_model_len"] == info["max_model_len"]


def test_stream_follows_live_requests(top_server: Server) -> None:
    prompt_tokens = _prompt_tokens(top_server.url)
    seen: list[dict[str, Any]] = []
    with Load(top_server.url, n=2) as load:
        url = f"{top_server.url}/v1/stats/stream"
        with httpx.stream("GET", url, params={"interval": 0.2}, timeout=30) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            parser = SSEParser()
            deadline = time.monotonic() + 60
            for line in r.iter_lines():
                event = parser.feed(line)
                if event is None:
                    continue
                assert event[0] == "stats"
                seen.append(json.loads(event[1]))
                rows = seen[-1]["requests"]
                busy = [s for s in seen if s["requests"]]
                if len(busy) >= 3 and any(r["output_tokens"] > 1 for r in rows):
                    break
                assert time.monotonic() < deadline, f"no live requests in the stream: {rows}"
        assert not load.errors
    seqs = [s["seq"] for s in seen]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    last = seen[-1]
    row = max(last["requests"], key=lambda r: r["output_tokens"])
    assert row["id"].startswith("cmpl-") and row["state"] in ("Decoding", "Prefilling")
    assert row["prompt_tokens"] == prompt_tokens and row["max_new_tokens"] in (300, 340)
    assert row["ttft_ms"] > 0 and row["tokens_per_s"] > 0
    assert last["num_requests"] >= 1 and last["scheduler"]["running"] >= 1
    assert last["kv"]["device"]["active"] > 0
    assert last["throughput"]["generation_tokens"] > seen[0]["throughput"]["generation_tokens"]
    assert last["throughput"]["generation_tokens_per_s"] > 0
    assert any(k["op"].startswith("attention.") for k in last["kernels"])


# ---- the dashboard ----------------------------------------------------------------------------
def test_dashboard_shows_the_server_under_load(top_server: Server) -> None:
    url = top_server.url
    info = httpx.get(f"{url}/get_server_info", timeout=10).json()
    prompt_tokens = _prompt_tokens(url)

    async def main() -> None:
        app = TopApp(url, 0.2, first=fetch_snapshot(url))
        async with app.run_test(size=(160, 48)) as pilot:
            table = app.query_one("#requests", DataTable)
            device = app.query_one("#device-bar", PageBar)
            host = app.query_one("#host-bar", PageBar)
            assert device.tier.total == info["kv_capacity"]["device_pages"]
            assert host.tier.total == info["kv_capacity"]["host_pages"]
            assert f"{info['kv_capacity']['device_pages']} pages" in str(device.render())
            assert MODEL in app.header_line and "TP1 DP1" in app.header_line
            assert url in app.header_line and "connected" in app.header_line
            with Load(url, n=3) as load:
                assert await _until(pilot, lambda: table.row_count >= 2), app.status_line
                assert await _until(pilot, lambda: (app.shown.total_tps or 0) > 0)
                assert await _until(pilot, lambda: app.shown.device_tier.active > 0)
                row = [str(c) for c in table.get_row_at(0)]
                assert row[0].startswith("cmpl-") and row[2] == str(prompt_tokens)
                assert "live requests" in app.status_line

                # p: the screen freezes while snapshots keep arriving.
                await pilot.press("p")
                frozen, received = app.shown.seq, app.snapshots_received
                assert await _until(pilot, lambda: app.snapshots_received >= received + 3)
                assert app.shown.seq == frozen and "PAUSED" in app.header_line
                await pilot.press("p")
                assert app.shown.seq > frozen and "PAUSED" not in app.header_line

                # Sort and filter work on the frozen screen, so requests that finish and are
                # replaced by the load meanwhile cannot change the rows under the assertions.
                assert await _freeze_with_rows(pilot, table, 2), app.status_line

                # s: the next sort column (age -> id), rows in id order.
                await pilot.press("s")
                assert "sort id" in app.status_line
                ids = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
                assert ids == sorted(ids)

                # /: filter by an id substring.
                target = ids[-1]
                await pilot.press("slash")
                assert isinstance(app.focused, Input)
                await pilot.press(*target.split("-")[1][:12])
                assert [str(table.get_row_at(i)[0]) for i in range(table.row_count)] == [target]
                await pilot.press("escape")
                assert app.filter_text == ""
                await pilot.press("p")
                assert "PAUSED" not in app.header_line
                assert not load.errors
            assert await _until(pilot, lambda: app.query_one("#kernels", DataTable).row_count > 0)
            await pilot.press("q")
        assert app.return_code == 0

    asyncio.run(main())


def _start_on(tmp: Path, port: int, timeout: float = 120.0) -> Server:
    """Like `start_server`, on a given port (to bring a server back where it was)."""
    log_path = tmp / f"server-{port}-{time.monotonic_ns()}.log"
    cmd = [sys.executable, "-m", "tokenspeed_cli.main", "serve", "--port", str(port), *FLAGS]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=os.environ.copy(), stdout=log,
                                stderr=subprocess.STDOUT)  # fmt: skip
    server = Server(proc, port, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()}")
        try:
            if httpx.get(f"{server.url}/health", timeout=1.0).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"server not healthy after {timeout} s:\n{server.log()}")


def test_dashboard_says_disconnected_and_reconnects(tmp_path: Path) -> None:
    first = start_server(tmp_path, *FLAGS)
    second: Server | None = None

    async def main() -> None:
        nonlocal second
        app = TopApp(first.url, 0.2, first=fetch_snapshot(first.url), backoff=Backoff(0.2, 1.0))
        async with app.run_test(size=(160, 48)) as pilot:
            assert await _until(pilot, lambda: app.snapshots_received >= 3)
            before = app.shown.uptime_s
            assert first.stop(signal.SIGTERM, timeout=30) == 0  # an open stream does not block it
            assert await _until(pilot, lambda: "disconnected — retrying" in app.header_line)
            assert "PAUSED" not in app.header_line
            second = await asyncio.to_thread(_start_on, tmp_path, first.port)
            assert await _until(pilot, lambda: app.header_line.endswith("│ connected"))
            seq = app.shown.seq
            assert await _until(pilot, lambda: app.shown.seq > seq)
            assert app.shown.uptime_s < before + 60  # the new server's clock
            assert app.shown.device_tier.total > 0
            await pilot.press("q")
        assert app.return_code == 0

    try:
        asyncio.run(main())
    finally:
        first.stop(signal.SIGKILL)
        if second is not None:
            second.stop()


# ---- failures: one line, non-zero exit --------------------------------------------------------
def _run_top(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", TOP_CLI, *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_unreachable_server_is_one_line_and_non_zero() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    res = _run_top("--url", url)
    assert res.returncode != 0
    assert "Traceback" not in res.stderr and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and url in lines[0] and "cannot connect" in lines[0], res.stderr


def test_wrong_url_is_one_line_and_non_zero(top_server: Server) -> None:
    res = _run_top("--url", f"{top_server.url}/nowhere")
    assert res.returncode != 0 and "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "no /v1/stats endpoint" in lines[0], res.stderr
