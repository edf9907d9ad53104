"""Talking to a running TokenSpeed server from the operator tools, with one-line errors.

Shared by ``inspect-cache`` (the cache snapshot) and ``replay-kv-events`` (the tokenizer of the
served model, for text traces).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx


class ServerError(RuntimeError):
    """The server is not there, is not a TokenSpeed server, or answered with an error."""


def get_json(
    url: str, path: str, params: dict[str, Any] | None = None, timeout_s: float = 30.0
) -> dict[str, Any]:
    """GET `url` + `path` as a JSON object; `ServerError` with one clear line otherwise."""
    base = url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise ServerError(f"{url!r} is not an http(s) URL (like http://127.0.0.1:8000)")
    target = base + path
    try:
        response = httpx.get(target, params=params, timeout=timeout_s)
    except httpx.TimeoutException:
        raise ServerError(f"the server at {base} did not answer in {timeout_s:.0f} s") from None
    except httpx.HTTPError as e:  # connection refused, DNS, bad URL
        raise ServerError(f"cannot reach a server at {base}: {e or type(e).__name__}") from None
    if response.status_code == 404:
        raise ServerError(f"{target} does not exist: is {base} a TokenSpeed server?")
    try:
        body = response.json()
    except ValueError:
        raise ServerError(f"{target} did not answer JSON: is {base} a TokenSpeed server?") from None
    if response.status_code != 200:
        message = body.get("error", {}).get("message") if isinstance(body, dict) else None
        raise ServerError(f"{target} answered {response.status_code}: {message or body}")
    if not isinstance(body, dict):
        raise ServerError(f"{target} did not answer a JSON object")
    return body


def load_tokenizer(directory: Path) -> Any:
    """The runtime's tokenizer from a model directory; `ServerError` if there is none."""
    from tokenspeed.runtime.tokenizer import Tokenizer

    try:
        return Tokenizer.from_dir(directory)
    except (OSError, ValueError) as e:
        raise ServerError(f"cannot load a tokenizer from {directory}: {e}") from None


def server_tokenizer(url: str) -> Any:
    """The tokenizer of the model a server serves (its model directory must be readable here)."""
    info = get_json(url, "/get_server_info")
    engine = info.get("engine") if isinstance(info.get("engine"), dict) else {}
    path = engine.get("model_path") or info.get("model_path")
    if not path:
        raise ServerError(f"{url} does not report its model path; give --tokenizer DIR")
    return load_tokenizer(Path(path))
