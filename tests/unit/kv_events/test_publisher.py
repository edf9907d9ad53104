"""The engine-side publisher and the CLI-side subscriber over real loopback sockets."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import zmq
from kv_driver import free_port

import tokenspeed.scheduler as ts
from tokenspeed.runtime.entrypoints.kv_events import (
    END_SEQ,
    KvEventPublisher,
    KvEventsConfig,
    encode_batch,
    start_publisher,
)
from tokenspeed_cli.kv_events.subscriber import Subscriber, SubscriberError
from tokenspeed_cli.kv_events.wire import decode_batch


def test_config_keys_are_validated() -> None:
    assert KvEventsConfig.parse({}) is None
    assert KvEventsConfig.parse({"publisher": "null", "endpoint": "tcp://*:1"}) is None
    assert KvEventsConfig.parse({"enable_kv_cache_events": False}) is None
    cfg = KvEventsConfig.parse({"endpoint": "tcp://127.0.0.1:9", "topic": "kv",
                                "buffer_steps": 5, "publisher": "zmq"})  # fmt: skip
    assert cfg == KvEventsConfig(endpoint="tcp://127.0.0.1:9", topic="kv", buffer_steps=5)
    bad = [
        ({"endpiont": "tcp://*:1"}, "unknown key 'endpiont'"),
        ({"buffer_steps": 0}, "buffer_steps must be an integer >= 1"),
        ({"buffer_steps": "9"}, "buffer_steps must be an integer"),
        ({"endpoint": 5}, "endpoint must be a string"),
        ({"endpoint": "localhost:5557"}, "not a ZMQ address"),
        ({"publisher": "kafka"}, "publisher must be"),
    ]
    for raw, message in bad:
        with pytest.raises(ValueError, match="kv_events_config") as info:
            KvEventsConfig.parse(raw)
        assert message in str(info.value)


@pytest.fixture
def publisher() -> Iterator[tuple[KvEventPublisher, str, str]]:
    pub_ep, replay_ep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    pub = start_publisher({"endpoint": pub_ep, "replay_endpoint": replay_ep, "topic": "kv",
                           "buffer_steps": 4})  # fmt: skip
    assert pub is not None
    yield pub, pub_ep, replay_ep
    pub.close()


def events(i: int) -> list[object]:
    return [ts.BlockStored([i], None, [i, i], 2, "GPU")]


def test_history_then_live_in_order(publisher: tuple[KvEventPublisher, str, str]) -> None:
    pub, pub_ep, replay_ep = publisher
    assert pub.publish([]) is None  # empty steps publish nothing
    for i in range(6):  # the ring keeps the last 4: seq 2..5
        assert pub.publish(events(i)) == i
    time.sleep(0.2)
    sub = Subscriber(pub_ep, replay_ep, topic="kv")
    try:
        got = []
        stream = sub.messages(since=0, deadline=time.monotonic() + 5)
        for msg in stream:
            got.append(msg)
            if len(got) == 4:
                for i in range(6, 8):
                    pub.publish(events(i))
            if len(got) == 6:
                break
        stream.close()
    finally:
        sub.close()
    assert [m.seq for m in got] == [2, 3, 4, 5, 6, 7]
    assert all(m.topic == b"kv" for m in got)
    assert [decode_batch(m.seq, m.payload).events[0].block_hashes for m in got] == [
        [2], [3], [4], [5], [6], [7]
    ]  # fmt: skip
    assert sub.replayed == 4


def test_replay_answers_req_sockets_too(publisher: tuple[KvEventPublisher, str, str]) -> None:
    """vLLM's example consumer asks with a REQ socket; the first answer must reach it."""
    pub, _, replay_ep = publisher
    pub.publish(events(1))
    time.sleep(0.2)
    ctx = zmq.Context()
    req = ctx.socket(zmq.REQ)
    req.connect(replay_ep)
    req.send((0).to_bytes(8, "big"))
    assert req.poll(3000)
    seq, payload = req.recv_multipart()
    assert int.from_bytes(seq, "big") == 0 and decode_batch(0, payload).events
    req.close(linger=0)
    ctx.term()


def test_bind_errors_are_one_line_and_close_frees_the_port() -> None:
    port = free_port()
    first = start_publisher({"endpoint": f"tcp://127.0.0.1:{port}"})
    assert first is not None
    with pytest.raises(ValueError, match=f"cannot bind tcp://127.0.0.1:{port}"):
        start_publisher({"endpoint": f"tcp://127.0.0.1:{port}"})
    first.close()
    again = start_publisher({"endpoint": f"tcp://127.0.0.1:{port}"})
    assert again is not None
    again.close()


def test_subscriber_fills_a_live_gap_from_the_replay_socket() -> None:
    """A hand-made publisher skips batches 1..2 on PUB; the subscriber fetches them by replay."""
    ctx = zmq.Context()
    pub_ep, replay_ep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    pub, router = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
    pub.bind(pub_ep)
    router.bind(replay_ep)
    payloads = {i: encode_batch(events(i), 0) for i in range(4)}
    stop = threading.Event()

    def serve_replays() -> None:
        while not stop.is_set():
            if router.poll(50):
                ident, empty, start = router.recv_multipart()
                for s in range(int.from_bytes(start, "big"), 4):
                    router.send_multipart([ident, empty, s.to_bytes(8, "big"), payloads[s]])
                router.send_multipart([ident, empty, END_SEQ, b""])

    thread = threading.Thread(target=serve_replays)
    thread.start()
    try:
        sub = Subscriber(pub_ep, replay_ep)
        stream = sub.messages(deadline=time.monotonic() + 5)
        pub.send_multipart([b"", (0).to_bytes(8, "big"), payloads[0]])
        first = next(stream)
        pub.send_multipart([b"", (3).to_bytes(8, "big"), payloads[3]])
        rest = [next(stream) for _ in range(3)]
        stream.close()
        sub.close()
    finally:
        stop.set()
        thread.join()
        pub.close(linger=0)
        router.close(linger=0)
        ctx.term()
    assert [m.seq for m in [first, *rest]] == [0, 1, 2, 3]
    assert sub.replayed == 2


def test_unreachable_endpoints_fail_clearly() -> None:
    with pytest.raises(SubscriberError, match="nothing is listening"):
        Subscriber(f"tcp://127.0.0.1:{free_port()}", connect_timeout_s=0.3)
    with pytest.raises(SubscriberError, match="cannot connect to 'nowhere'"):
        Subscriber("nowhere")
