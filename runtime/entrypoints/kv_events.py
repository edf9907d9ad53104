"""KV-cache event publishing from the engine process, in the framing vLLM's consumers read.

The scheduler records `BlockStored` / `BlockRemoved` / `AllBlocksCleared` as its radix tree
changes; the engine drains them after every step and hands them to `KvEventPublisher`, which

- packs one batch per step as msgpack ``[timestamp, [event, ...], dp_rank]`` (each event is the
  scheduler's ``to_wire()`` array: ``["BlockStored", hashes, parent, token_ids, block_size,
  lora_id, medium]``, ``["BlockRemoved", hashes, medium]``, ``["AllBlocksCleared"]``),
- numbers the batches 0, 1, 2, ... in the engine thread (so anything dropped shows up as a
  sequence gap downstream, never as silently missing events),
- sends ``[topic, seq as 8-byte big-endian, payload]`` on a ZMQ PUB socket, and
- keeps the last ``buffer_steps`` batches in a ring buffer that an optional ROUTER socket
  replays: a request carrying an 8-byte big-endian start sequence is answered with one
  ``[seq, payload]`` message per buffered batch from that sequence on, then an end marker
  ``[-1 as 8 signed bytes, b""]``.

Sockets live on one background thread (ZMQ sockets are single-threaded); the engine thread only
packs the batch and pushes it over an in-process pipe, so a slow subscriber never slows a step.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

import msgpack
import zmq

logger = logging.getLogger("tokenspeed.engine")

#: Replay end marker: sequence -1 (8 signed big-endian bytes) with an empty payload.
END_SEQ = (-1).to_bytes(8, "big", signed=True)

_POLL_MS = 100


@dataclasses.dataclass(frozen=True)
class KvEventsConfig:
    """The accepted keys of ``--kv-events-config`` (vLLM's names where they exist)."""

    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    topic: str = ""
    buffer_steps: int = 10_000
    hwm: int = 100_000
    dp_rank: int = 0

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> KvEventsConfig | None:
        """Validate a ``--kv-events-config`` dict; ``None`` when publishing is off.

        vLLM's ``publisher`` ("zmq" or "null") and ``enable_kv_cache_events`` are accepted so
        a vLLM config works unchanged. Raises ``ValueError`` naming the bad key.
        """
        if not raw:
            return None
        values = dict(raw)
        enabled = values.pop("enable_kv_cache_events", True)
        publisher = values.pop("publisher", "zmq")
        if not isinstance(enabled, bool):
            raise ValueError("kv_events_config: enable_kv_cache_events must be true or false")
        if publisher not in ("zmq", "null"):
            raise ValueError(
                f"kv_events_config: publisher must be 'zmq' or 'null', not {publisher!r}"
            )
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            accepted = ", ".join(sorted([*known, "publisher", "enable_kv_cache_events"]))
            raise ValueError(f"kv_events_config: unknown key {unknown[0]!r} (accepted: {accepted})")
        if not enabled or publisher == "null":
            return None
        for name in ("endpoint", "topic"):
            if name in values and not isinstance(values[name], str):
                raise ValueError(f"kv_events_config: {name} must be a string")
        replay = values.get("replay_endpoint")
        if replay is not None and not isinstance(replay, str):
            raise ValueError("kv_events_config: replay_endpoint must be a string or null")
        for name, lowest in (("buffer_steps", 1), ("hwm", 0), ("dp_rank", 0)):
            v = values.get(name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < lowest):
                raise ValueError(f"kv_events_config: {name} must be an integer >= {lowest}")
        config = cls(**values)
        if "://" not in config.endpoint:
            raise ValueError(
                f"kv_events_config: endpoint {config.endpoint!r} is not a ZMQ address "
                "(like tcp://*:5557)"
            )
        if config.replay_endpoint is not None and "://" not in config.replay_endpoint:
            raise ValueError(
                f"kv_events_config: replay_endpoint {config.replay_endpoint!r} is not a ZMQ address"
            )
        return config


def encode_batch(events: Iterable[Any], dp_rank: int, ts: float | None = None) -> bytes:
    """One step's events as the msgpack batch ``[ts, [wire events], dp_rank]``.

    Events are scheduler event objects (with ``to_wire()``) or already wire-form sequences.
    """
    wire = [e.to_wire() if hasattr(e, "to_wire") else e for e in events]
    return msgpack.packb([time.time() if ts is None else ts, wire, dp_rank], use_bin_type=True)


class KvEventPublisher:
    """Publishes numbered event batches on PUB and answers replay requests from a ring buffer."""

    def __init__(self, config: KvEventsConfig) -> None:
        """Bind every socket now, so a bad or busy address fails engine start-up at once."""
        self.config = config
        self.topic = config.topic.encode()
        self._seq = 0
        self.dropped = 0
        self._ctx = zmq.Context()
        self._inproc = f"inproc://kv-events-{id(self)}"
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.RCVHWM, 0)
        self._pull.bind(self._inproc)
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.SNDHWM, config.hwm)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.connect(self._inproc)
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, config.hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay: zmq.Socket[bytes] | None = None
        try:
            self._pub.bind(config.endpoint)
            if config.replay_endpoint:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(config.replay_endpoint)
        except zmq.ZMQError as e:
            self._close_sockets()
            where = config.endpoint if self._replay is None else config.replay_endpoint
            raise ValueError(f"kv_events_config: cannot bind {where}: {e}") from None
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)  # thread-only
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()
        logger.info(
            "publishing KV events on %s%s (topic %r)",
            config.endpoint,
            f", replay on {config.replay_endpoint}" if config.replay_endpoint else "",
            config.topic,
        )

    @property
    def last_seq(self) -> int:
        """Sequence number of the last batch handed to the publisher (-1 before the first)."""
        return self._seq - 1

    def publish(self, events: list[Any]) -> int | None:
        """Queue one step's events as one batch; returns its sequence number (None if empty).

        Called on the engine thread; never blocks. A batch the pipe cannot take is dropped and
        counted, and its sequence number is still consumed, so consumers see the gap.
        """
        if not events:
            return None
        seq = self._seq
        self._seq += 1
        payload = encode_batch(events, self.config.dp_rank)
        try:
            self._push.send_multipart([seq.to_bytes(8, "big"), payload], zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.dropped += 1
        return seq

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued, stop the thread, release the ports. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():  # never hang shutdown on it; the daemon thread dies with us
            logger.warning("the KV-event publisher thread did not stop in %.1f s", timeout_s)
            return
        self._close_sockets()

    # ---- the publisher thread -----------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._pull, zmq.POLLIN)
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        while True:
            ready = dict(poller.poll(_POLL_MS))
            if self._pull in ready:
                self._forward_pending()
            if self._replay is not None and self._replay in ready:
                self._answer_replays()
            if self._stop.is_set():
                self._forward_pending()
                return

    def _forward_pending(self) -> None:
        while True:
            try:
                seq_bytes, payload = self._pull.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self._pub.send_multipart([self.topic, seq_bytes, payload], zmq.NOBLOCK)
            except zmq.Again:
                pass  # PUB drops for slow subscribers by itself; replay still has the batch
            self._buffer.append((int.from_bytes(seq_bytes, "big"), payload))

    def _answer_replays(self) -> None:
        assert self._replay is not None
        while True:
            try:
                frames = self._replay.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            # REQ peers (and DEALERs that mimic them) put an empty delimiter before the body.
            envelope = frames[:2] if len(frames) >= 3 and frames[1] == b"" else frames[:1]
            body = frames[len(envelope) :]
            if len(body) != 1 or len(body[0]) != 8:
                logger.warning("ignoring a malformed KV-event replay request")
                continue
            start = int.from_bytes(body[0], "big")
            try:
                for s, p in [(s, p) for s, p in self._buffer if s >= start]:
                    self._replay.send_multipart([*envelope, s.to_bytes(8, "big"), p])
                self._replay.send_multipart([*envelope, END_SEQ, b""])
            except zmq.ZMQError as e:
                logger.warning("KV-event replay answer failed: %s", e)

    def _close_sockets(self) -> None:
        for sock in (self._push, self._pull, self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._ctx.term()


def start_publisher(raw_config: Mapping[str, Any] | None) -> KvEventPublisher | None:
    """The publisher ``--kv-events-config`` asks for, bound and running; ``None`` when off.

    Raises ``ValueError`` with one clear line for a bad key, value or address, which the engine
    reports as its start-up failure.
    """
    config = KvEventsConfig.parse(raw_config or {})
    return None if config is None else KvEventPublisher(config)
