"""The wire between the HTTP process and the engine process: ZMQ PUSH/PULL over ipc://, msgpack.

Two one-way sockets, both bound by the main process (it lives longest) in a private temp dir:
`in` carries requests, aborts, stats queries and shutdown to the engine; `out` carries the
engine's readiness, one batch of per-request token deltas per step, stats replies and errors.
Messages are plain dicts with a `type` key so both sides stay readable and decoupled.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

# main -> engine
ADD = "add"
ABORT = "abort"
STATS = "stats"
CACHE_SNAPSHOT = "cache_snapshot"  # answered with STATS_REPLY (same qid routing)
SHUTDOWN = "shutdown"
# engine -> main
READY = "ready"
OUTPUTS = "outputs"
STATS_REPLY = "stats_reply"
REJECTED = "rejected"
FATAL = "fatal"


@dataclass(frozen=True)
class IpcPaths:
    """Socket addresses and the engine's argument file, all inside one temp directory."""

    root: Path

    @property
    def to_engine(self) -> str:
        return f"ipc://{self.root / 'to_engine.sock'}"

    @property
    def from_engine(self) -> str:
        return f"ipc://{self.root / 'from_engine.sock'}"

    @property
    def args_file(self) -> Path:
        return self.root / "server_args.json"


def pack(message: dict[str, Any]) -> bytes:
    """Encode one message."""
    return msgpack.packb(message, use_bin_type=True)


def unpack(data: bytes) -> dict[str, Any]:
    """Decode one message."""
    return msgpack.unpackb(data, raw=False)
