"""The dashboard's wire (SSE parsing, URLs, one-line errors) and its stacked page bar."""

from __future__ import annotations

import socket

import httpx
import pytest

from tokenspeed_cli.top.client import (
    SSEParser,
    StatsError,
    describe,
    fetch_snapshot,
    normalize_url,
)
from tokenspeed_cli.top.widgets import split_cells


def test_sse_parser_yields_events_at_blank_lines() -> None:
    p = SSEParser()
    lines = [": keep-alive", "", "event: stats", "id: 3", "data: {\"a\":", "data: 1}", "",
             "data: plain", "", ""]  # fmt: skip
    events = [e for e in (p.feed(line) for line in lines) if e is not None]
    assert events == [("stats", '{"a":\n1}'), ("message", "plain")]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
        ("localhost:9000", "http://localhost:9000"),
        ("https://example.com/base", "https://example.com/base"),
    ],
)
def test_normalize_url(given: str, expected: str) -> None:
    assert normalize_url(given) == expected


@pytest.mark.parametrize("bad", ["ftp://host:1", "http://", "http://[::1"])
def test_normalize_url_rejects_unusable_urls(bad: str) -> None:
    with pytest.raises(StatsError, match="invalid URL"):
        normalize_url(bad)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_fetch_snapshot_from_nothing_is_one_clear_line() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(StatsError) as info:
        fetch_snapshot(url, timeout_s=2.0)
    message = str(info.value)
    assert message == f"cannot connect to {url} (is `tokenspeed serve` running there?)"


def test_describe_names_the_failure() -> None:
    req = httpx.Request("GET", "http://x")
    assert "did not answer in time" in describe(httpx.ReadTimeout("t", request=req), "http://x")
    assert "closed the connection" in describe(
        httpx.RemoteProtocolError("eof", request=req), "http://x"
    )
    assert describe(StatsError("as is"), "http://x") == "as is"


@pytest.mark.parametrize("width", [0, 1, 2, 7, 10, 79, 200])
@pytest.mark.parametrize(
    "fractions", [(0.25, 0.15, 0.6), (0.001, 0.0, 0.999), (0.0, 0.0, 1.0), (1 / 3,) * 3]
)
def test_split_cells_fills_the_width_and_keeps_small_shares_visible(
    width: int, fractions: tuple[float, ...]
) -> None:
    cells = split_cells(width, fractions)
    assert sum(cells) == width and all(c >= 0 for c in cells)
    if width >= len(fractions):
        assert all(c >= 1 for c, f in zip(cells, fractions, strict=True) if f > 0)
    for c, f in zip(cells, fractions, strict=True):
        if f == 0:
            assert c == 0
        elif width >= 10:
            assert abs(c - f * width) <= 1.5


def test_split_cells_of_an_empty_tier() -> None:
    assert split_cells(10, (0.0, 0.0, 0.0)) == [0, 0, 0]
