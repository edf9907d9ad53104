"""Receiving a live KV-event stream: a SUB socket, plus history from the replay socket.

The replay protocol (vLLM's): send an 8-byte big-endian start sequence to the publisher's
ROUTER; it answers ``[seq, payload]`` for every buffered batch from there on, then
``[-1, b""]``. We talk to it from a DEALER that adds REQ's empty delimiter, so several answer
messages can be read for one request.

Order of operations, so that nothing falls between history and live: connect SUB first and let
the subscription settle, then ask for history, then read live messages, skipping sequence numbers
already seen. If a live message skips numbers and a replay socket is known, the missing batches
are fetched from it before the message is passed on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import zmq
from zmq.utils.monitor import recv_monitor_message

from tokenspeed_cli.kv_events.recording import RawMessage

END_SEQ = -1
SETTLE_S = 0.3


class SubscriberError(RuntimeError):
    """The endpoint cannot be reached or does not speak the protocol; one clear line."""


def _connect(ctx: zmq.Context[zmq.Socket[bytes]], kind: int, endpoint: str,
             timeout_s: float) -> zmq.Socket[bytes]:  # fmt: skip
    """A socket connected to `endpoint`; `SubscriberError` if nothing listens there in time."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if not endpoint.startswith("tcp://"):  # ipc/inproc connect at once or never
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as e:
            sock.close(linger=0)
            raise SubscriberError(f"cannot connect to {endpoint!r}: {e}") from None
        return sock
    monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED)
    try:
        sock.connect(endpoint)
        connected = bool(monitor.poll(int(timeout_s * 1000)))
        if connected:
            recv_monitor_message(monitor)
        error = f"nothing is listening at {endpoint} (waited {timeout_s:.0f} s)"
    except zmq.ZMQError as e:
        connected, error = False, f"cannot connect to {endpoint!r}: {e}"
    sock.disable_monitor()
    monitor.close(linger=0)
    if not connected:
        sock.close(linger=0)
        raise SubscriberError(error)
    return sock


class Subscriber:
    """Messages from a publisher's PUB endpoint and/or its replay endpoint, in sequence order."""

    def __init__(
        self,
        endpoint: str | None,
        replay_endpoint: str | None = None,
        topic: str = "",
        connect_timeout_s: float = 3.0,
        replay_timeout_s: float = 5.0,
    ) -> None:
        """Connect now; `SubscriberError` when an endpoint cannot be reached."""
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.replay_timeout_s = replay_timeout_s
        self.sub: zmq.Socket[bytes] | None = None
        self.replay_sock: zmq.Socket[bytes] | None = None
        self.endpoint, self.replay_endpoint = endpoint, replay_endpoint
        self.topic = topic.encode()
        self.last_seq: int | None = None
        self.replayed = 0
        try:
            if endpoint:
                self.sub = _connect(self.ctx, zmq.SUB, endpoint, connect_timeout_s)
                self.sub.setsockopt(zmq.SUBSCRIBE, self.topic)
                self.sub.setsockopt(zmq.RCVHWM, 0)
                time.sleep(SETTLE_S)  # the subscription reaches the publisher asynchronously
            if replay_endpoint:
                self.replay_sock = _connect(self.ctx, zmq.DEALER, replay_endpoint,
                                            connect_timeout_s)  # fmt: skip
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the sockets."""
        for sock in (self.sub, self.replay_sock):
            if sock is not None:
                sock.close(linger=0)
        self.ctx.term()

    def replay(self, since: int, until: int | None = None) -> Iterator[RawMessage]:
        """Buffered batches from `since` (up to `until` inclusive when given) from the replay
        socket; `SubscriberError` when it does not answer."""
        if self.replay_sock is None:
            raise SubscriberError("no replay endpoint given")
        self.replay_sock.send_multipart([b"", max(0, since).to_bytes(8, "big")])
        while True:
            if not self.replay_sock.poll(int(self.replay_timeout_s * 1000)):
                raise SubscriberError(
                    f"the replay endpoint {self.replay_endpoint} did not answer in "
                    f"{self.replay_timeout_s:.0f} s"
                )
            frames = self.replay_sock.recv_multipart()
            if frames and frames[0] == b"":
                frames = frames[1:]
            if len(frames) != 2 or len(frames[0]) != 8:
                raise SubscriberError(
                    f"the replay endpoint {self.replay_endpoint} sent a message that is not "
                    "[seq, payload]"
                )
            seq = int.from_bytes(frames[0], "big", signed=True)
            if seq == END_SEQ or not frames[1]:
                return
            if (self.last_seq is None or seq > self.last_seq) and (until is None or seq <= until):
                self.last_seq = seq
                self.replayed += 1
                yield RawMessage(seq, self.topic, frames[1], time.time())

    def messages(
        self,
        since: int | None = None,
        deadline: float | None = None,
        stop: Callable[[], bool] = lambda: False,
    ) -> Iterator[RawMessage]:
        """History from `since` (when a replay endpoint is known), then live messages until
        `deadline` (a `time.monotonic()` value) or `stop()`; without a PUB endpoint, history only."""
        if since is not None and self.replay_sock is not None:
            yield from self.replay(since)
        if self.sub is None:
            return
        while not stop() and (deadline is None or time.monotonic() < deadline):
            if not self.sub.poll(50):
                continue
            frames = self.sub.recv_multipart()
            if len(frames) != 3 or len(frames[1]) != 8:
                raise SubscriberError(
                    f"{self.endpoint} sent a {len(frames)}-frame message; a KV-event publisher "
                    "sends [topic, seq, payload]"
                )
            seq = int.from_bytes(frames[1], "big")
            if self.last_seq is not None and seq <= self.last_seq:
                continue  # already had it from the replay
            if self.last_seq is not None and seq > self.last_seq + 1 and self.replay_sock:
                yield from self.replay(self.last_seq + 1, until=seq - 1)
            self.last_seq = seq
            yield RawMessage(seq, frames[0], frames[2], time.time())
