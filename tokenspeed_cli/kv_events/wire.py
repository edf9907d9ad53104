"""Decoding the KV-event wire format (vLLM's): msgpack batches of tagged array-like events.

A batch is ``[ts, [event, ...]]`` or ``[ts, [event, ...], dp_rank]``; events are
``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, ...]``,
``["BlockRemoved", block_hashes, medium, ...]`` and ``["AllBlocksCleared", ...]``. Trailing fields
that newer vLLM releases append (``lora_name``, ``extra_keys``, ...) are ignored, and a missing
``medium`` reads as ``"GPU"`` (older releases had none). Hashes are kept as they come: ints
(TokenSpeed, recent vLLM) or bytes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgpack

#: The medium of a block whose event names none.
DEFAULT_MEDIUM = "GPU"

BlockHash = int | bytes


class MalformedEvent(ValueError):
    """A payload or event that does not follow the wire format; the message says where."""


@dataclass(frozen=True)
class BlockStored:
    """Consecutive blocks of one path became resident on `medium`."""

    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str = DEFAULT_MEDIUM

    def to_wire(self) -> list[Any]:
        """The tagged array form (for tests and tools that produce streams)."""
        return ["BlockStored", self.block_hashes, self.parent_block_hash, self.token_ids,
                self.block_size, self.lora_id, self.medium]  # fmt: skip


@dataclass(frozen=True)
class BlockRemoved:
    """Blocks stopped being resident on `medium`."""

    block_hashes: list[BlockHash]
    medium: str = DEFAULT_MEDIUM

    def to_wire(self) -> list[Any]:
        """The tagged array form."""
        return ["BlockRemoved", self.block_hashes, self.medium]


@dataclass(frozen=True)
class AllBlocksCleared:
    """Every block on every medium was dropped."""

    def to_wire(self) -> list[Any]:
        """The tagged array form."""
        return ["AllBlocksCleared"]


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass
class EventBatch:
    """One published message: its sequence number, the batch's timestamp, events and rank."""

    seq: int
    ts: float
    events: list[KvEvent] = field(default_factory=list)
    dp_rank: int | None = None


def _hashes(value: Any, where: str) -> list[BlockHash]:
    if not isinstance(value, list) or not all(isinstance(h, int | bytes) for h in value):
        raise MalformedEvent(f"{where}: block_hashes must be a list of ints or bytes")
    return value


def decode_event(raw: Any, where: str = "event") -> KvEvent:
    """One tagged array-like event; raises `MalformedEvent` for anything else."""
    if not isinstance(raw, list | tuple) or not raw or not isinstance(raw[0], str):
        raise MalformedEvent(f"{where}: not a tagged event array")
    tag, fields = raw[0], list(raw[1:])
    if tag == "BlockStored":
        if len(fields) < 4:
            raise MalformedEvent(f"{where}: BlockStored has {len(fields)} fields, expected >= 4")
        hashes = _hashes(fields[0], where)
        parent, tokens, size = fields[1], fields[2], fields[3]
        if parent is not None and not isinstance(parent, int | bytes):
            raise MalformedEvent(f"{where}: parent_block_hash must be a hash or null")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise MalformedEvent(f"{where}: token_ids must be a list of ints")
        if not isinstance(size, int) or size <= 0:
            raise MalformedEvent(f"{where}: block_size must be a positive int")
        lora = fields[4] if len(fields) > 4 else None
        medium = fields[5] if len(fields) > 5 and fields[5] is not None else DEFAULT_MEDIUM
        return BlockStored(hashes, parent, tokens, size, lora, str(medium))
    if tag == "BlockRemoved":
        if not fields:
            raise MalformedEvent(f"{where}: BlockRemoved has no block_hashes")
        medium = fields[1] if len(fields) > 1 and fields[1] is not None else DEFAULT_MEDIUM
        return BlockRemoved(_hashes(fields[0], where), str(medium))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise MalformedEvent(f"{where}: unknown event type {tag!r}")


def decode_batch(seq: int, payload: bytes) -> EventBatch:
    """One message's msgpack payload; raises `MalformedEvent` naming the sequence number."""
    where = f"batch {seq}"
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (msgpack.UnpackException, ValueError, TypeError) as e:
        raise MalformedEvent(f"{where}: payload is not msgpack ({e})") from None
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise MalformedEvent(f"{where}: expected [timestamp, [events...], dp_rank]")
    ts, events = raw[0], raw[1]
    if not isinstance(ts, int | float):
        raise MalformedEvent(f"{where}: timestamp is not a number")
    dp_rank = raw[2] if len(raw) > 2 and isinstance(raw[2], int) else None
    decoded = [decode_event(e, f"{where} event {i}") for i, e in enumerate(events)]
    return EventBatch(seq, float(ts), decoded, dp_rank)


def encode_batch(events: list[KvEvent], dp_rank: int | None = 0, ts: float | None = None) -> bytes:
    """The msgpack payload for `events` (what a publisher sends; tests build streams with it)."""
    body: list[Any] = [time.time() if ts is None else ts, [e.to_wire() for e in events]]
    if dp_rank is not None:
        body.append(dp_rank)
    return msgpack.packb(body, use_bin_type=True)
