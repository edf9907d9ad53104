"""The recording format of ``replay-kv-events --record``: raw messages appended to one file.

Layout: the 8 magic bytes ``TSKVREC\\x01``, a msgpack header map (``format``, ``version``,
``created``, ``source``, ``topic``, ``since``), then one msgpack array per received message,
``[seq, topic, payload, received_at]``, with the payload exactly as published (so a recording
replays through the same decoder as a live stream, and keeps whatever it did not understand).
Each message is flushed as it is written; a recorder killed mid-write leaves at most one partial
record at the end, which the reader reports as truncated and otherwise ignores.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import msgpack

MAGIC = b"TSKVREC\x01"
FORMAT = "tokenspeed-kv-events"
VERSION = 1


class RecordingError(ValueError):
    """A file that is not a readable recording; the message names the file and the problem."""


@dataclass(frozen=True)
class RawMessage:
    """One published message as received: the three frames and when it arrived."""

    seq: int
    topic: bytes
    payload: bytes
    received_at: float


class RecordingWriter:
    """Appends messages to a new recording file (context manager)."""

    def __init__(
        self,
        path: Path,
        source: str | None = None,
        topic: str | None = None,
        since: int | None = None,
    ) -> None:
        """Create (or replace) `path` and write the header; `OSError` if it cannot.

        `since` is the sequence number the recording is complete from (the replay start), or
        None when it starts wherever the subscriber joined.
        """
        self.path = path
        self.count = 0
        self._file: IO[bytes] = path.open("wb")
        self._packer = msgpack.Packer(use_bin_type=True)
        header = {"format": FORMAT, "version": VERSION, "created": time.time(),
                  "source": source, "topic": topic, "since": since}  # fmt: skip
        self._file.write(MAGIC + self._packer.pack(header))
        self._file.flush()

    def write(self, message: RawMessage) -> None:
        """Append one message and flush it."""
        record = [message.seq, message.topic, message.payload, message.received_at]
        self._file.write(self._packer.pack(record))
        self._file.flush()
        self.count += 1

    def close(self) -> None:
        """Close the file."""
        self._file.close()

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Recording:
    """A recording's header and messages; `truncated` when the last record was cut off."""

    path: Path
    header: dict[str, Any]
    messages: list[RawMessage]
    truncated: bool = False


def _record(obj: Any, path: Path, index: int) -> RawMessage:
    ok = (
        isinstance(obj, list)
        and len(obj) == 4
        and isinstance(obj[0], int)
        and isinstance(obj[1], bytes)
        and isinstance(obj[2], bytes)
        and isinstance(obj[3], int | float)
    )
    if not ok:
        raise RecordingError(f"{path}: record {index} is not [seq, topic, payload, received_at]")
    return RawMessage(obj[0], obj[1], obj[2], float(obj[3]))


def _iter_file(path: Path, data: IO[bytes]) -> Iterator[Any]:
    if data.read(len(MAGIC)) != MAGIC:
        raise RecordingError(f"{path} is not a KV-event recording (bad magic bytes)")
    unpacker = msgpack.Unpacker(data, raw=False, strict_map_key=False, max_buffer_size=1 << 30)
    try:
        yield from unpacker
    except (msgpack.UnpackException, ValueError) as e:
        raise RecordingError(f"{path}: corrupt data ({e})") from None
    end = data.seek(0, 2)
    yield ("__end__", len(MAGIC) + unpacker.tell() < end)


def read_recording(path: Path) -> Recording:
    """Load a whole recording; `RecordingError` (one clear line) when it is not one."""
    try:
        handle = path.open("rb")
    except OSError as e:
        raise RecordingError(f"cannot read {path}: {e.strerror or e}") from None
    with handle:
        items = _iter_file(path, handle)
        header = next(items, None)
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise RecordingError(f"{path} is not a KV-event recording (no header)")
        if header.get("version") != VERSION:
            raise RecordingError(f"{path}: unsupported recording version {header.get('version')!r}")
        messages: list[RawMessage] = []
        truncated = False
        for obj in items:
            if isinstance(obj, tuple) and obj[:1] == ("__end__",):
                truncated = bool(obj[1])
                break
            messages.append(_record(obj, path, len(messages)))
    return Recording(path, header, messages, truncated)
