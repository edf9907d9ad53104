"""The dashboard's side of the wire: one-shot `/v1/stats` and the `/v1/stats/stream` SSE feed.

Every failure becomes a `StatsError` with a one-line reason, so the command can print it and
the dashboard can show it in its header.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

STATS_PATH = "/v1/stats"
STREAM_PATH = "/v1/stats/stream"


class StatsError(RuntimeError):
    """The server could not be read; the message says why in one line."""


def normalize_url(url: str) -> str:
    """`host:port` or a full URL, without a trailing slash; `StatsError` if unusable."""
    url = url.strip()
    if "://" not in url:
        url = f"http://{url}"
    url = url.rstrip("/")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as e:
        raise StatsError(f"invalid URL {url!r}: {e}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise StatsError(f"invalid URL {url!r}: expected http://HOST:PORT")
    return url


def describe(err: BaseException, url: str) -> str:
    """A one-line reason for a failed request to the server at `url`."""
    if isinstance(err, StatsError):
        return str(err)
    if isinstance(err, httpx.ConnectError):
        return f"cannot connect to {url} (is `tokenspeed serve` running there?)"
    if isinstance(err, httpx.TimeoutException):
        return f"{url} did not answer in time"
    if isinstance(err, httpx.RemoteProtocolError):
        return f"{url} closed the connection"
    if isinstance(err, httpx.HTTPError):
        return f"{url}: {type(err).__name__}: {err}"
    return f"{type(err).__name__}: {err}"


def _check_response(r: httpx.Response, url: str, body: str | None = None) -> None:
    if r.status_code == 200:
        return
    if r.status_code == 404:
        raise StatsError(f"{url} has no {STATS_PATH} endpoint (not a TokenSpeed server?)")
    message = ""
    try:
        message = json.loads(body if body is not None else r.text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        pass
    raise StatsError(f"{url} answered HTTP {r.status_code}" + (f": {message}" if message else ""))


def fetch_snapshot(url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """One snapshot from `GET /v1/stats` (used to fail fast before the dashboard opens)."""
    try:
        r = httpx.get(url + STATS_PATH, timeout=timeout_s)
    except httpx.HTTPError as e:
        raise StatsError(describe(e, url)) from None
    _check_response(r, url)
    try:
        data = r.json()
    except ValueError:
        raise StatsError(f"{url}{STATS_PATH} did not return JSON") from None
    if not isinstance(data, dict) or "version" not in data:
        raise StatsError(f"{url}{STATS_PATH} did not return a stats snapshot")
    return data


@dataclass
class SSEParser:
    """Incremental server-sent-events parser: feed lines, get (event, data) at blank lines."""

    event: str = ""
    data: list[str] = field(default_factory=list)

    def feed(self, line: str) -> tuple[str, str] | None:
        """Consume one line (without its newline); return a complete event, if this ended one."""
        if line == "":
            if not self.data:
                self.event = ""
                return None
            out = (self.event or "message", "\n".join(self.data))
            self.event, self.data = "", []
            return out
        if line.startswith(":"):
            return None  # comment / keep-alive
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self.event = value
        elif name == "data":
            self.data.append(value)
        return None


async def iter_snapshots(
    client: httpx.AsyncClient, url: str, interval: float
) -> AsyncIterator[dict[str, Any]]:
    """Snapshots from the SSE stream until it ends; connection problems raise `httpx` errors."""
    timeout = httpx.Timeout(5.0, read=max(10.0, interval * 10))
    params = {"interval": interval}
    async with client.stream("GET", url + STREAM_PATH, params=params, timeout=timeout) as r:
        if r.status_code != 200:
            body = (await r.aread()).decode(errors="replace")
            _check_response(r, url, body)
        parser = SSEParser()
        async for line in r.aiter_lines():
            event = parser.feed(line.rstrip("\r"))
            if event is None or event[0] != "stats":
                continue
            try:
                yield json.loads(event[1])
            except ValueError:
                raise StatsError(f"{url}{STREAM_PATH} sent an event that is not JSON") from None
