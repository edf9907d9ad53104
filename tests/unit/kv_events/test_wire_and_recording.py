"""Decoding the wire format and the recording file round trip."""

from __future__ import annotations

import random
from pathlib import Path

import msgpack
import pytest
from kv_driver import Driver, shared_prefix_workload

import tokenspeed.scheduler as ts
from tokenspeed.runtime.entrypoints.kv_events import encode_batch
from tokenspeed_cli.kv_events.recording import (
    MAGIC,
    RawMessage,
    RecordingError,
    RecordingWriter,
    read_recording,
)
from tokenspeed_cli.kv_events.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    MalformedEvent,
    decode_batch,
)


def test_scheduler_events_decode_with_vllm_field_order() -> None:
    events = [
        ts.BlockStored([2**64 - 1, 5], None, [1, 2, 3, 4], 2, "CPU"),
        ts.BlockRemoved([7], "GPU"),
        ts.AllBlocksCleared(),
    ]
    payload = encode_batch(events, dp_rank=3, ts=12.5)
    raw = msgpack.unpackb(payload)
    assert raw[0] == 12.5 and raw[2] == 3
    assert raw[1][0] == ["BlockStored", [2**64 - 1, 5], None, [1, 2, 3, 4], 2, None, "CPU"]
    assert raw[1][1] == ["BlockRemoved", [7], "GPU"]
    assert raw[1][2] == ["AllBlocksCleared"]
    batch = decode_batch(9, payload)
    assert (batch.seq, batch.ts, batch.dp_rank) == (9, 12.5, 3)
    assert batch.events == [
        BlockStored([2**64 - 1, 5], None, [1, 2, 3, 4], 2, None, "CPU"),
        BlockRemoved([7], "GPU"),
        AllBlocksCleared(),
    ]


def test_older_and_newer_vllm_shapes_are_accepted() -> None:
    # No dp_rank, no medium (older); extra trailing fields (newer); bytes hashes.
    payload = msgpack.packb([1.0, [["BlockStored", [b"\x01"], None, [1, 2], 2, None],
                                   ["BlockStored", [3], 1, [1, 2], 2, None, "GPU", "lora", []],
                                   ["BlockRemoved", [3]]]])  # fmt: skip
    batch = decode_batch(0, payload)
    assert batch.dp_rank is None
    assert [getattr(e, "medium", None) for e in batch.events] == ["GPU", "GPU", "GPU"]
    assert batch.events[0].block_hashes == [b"\x01"]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"\xc1", "not msgpack"),
        (msgpack.packb({"a": 1}), "expected [timestamp"),
        (msgpack.packb([1.0, [["Nope"]]]), "unknown event type 'Nope'"),
        (msgpack.packb([1.0, [["BlockStored", [1], None]]]), "expected >= 4"),
        (msgpack.packb([1.0, [["BlockStored", ["x"], None, [1], 1]]]), "block_hashes"),
        (msgpack.packb([1.0, [["BlockStored", [1], None, [1], 0]]]), "block_size"),
        (msgpack.packb([1.0, [[]]]), "not a tagged event"),
        (msgpack.packb(["t", []]), "timestamp"),
    ],
)
def test_malformed_payloads_say_where(payload: bytes, message: str) -> None:
    with pytest.raises(MalformedEvent, match="batch 4") as info:
        decode_batch(4, payload)
    assert message in str(info.value)


def test_recording_round_trip(tmp_path: Path, rng: random.Random) -> None:
    driver = Driver()
    shared_prefix_workload(driver, rng, groups=2, per_group=2)
    driver.run(rng)
    path = tmp_path / "events.tskv"
    sent = [RawMessage(i, b"kv", p, 100.0 + i) for i, p in enumerate(driver.batches)]
    with RecordingWriter(path, "tcp://x:1", "kv", since=0) as writer:
        for m in sent:
            writer.write(m)
    rec = read_recording(path)
    assert rec.messages == sent and not rec.truncated
    assert rec.header["source"] == "tcp://x:1" and rec.header["since"] == 0
    # A recorder killed mid-write leaves a partial record: reported, the rest still reads.
    data = path.read_bytes()
    (tmp_path / "cut.tskv").write_bytes(data[:-3])
    cut = read_recording(tmp_path / "cut.tskv")
    assert cut.truncated and cut.messages == sent[:-1]


def test_not_a_recording(tmp_path: Path) -> None:
    cases = {
        "missing.tskv": None,
        "text.tskv": b'{"format": "tokenspeed-cache-snapshot"}',
        "noheader.tskv": MAGIC + msgpack.packb([1, 2]),
        "version.tskv": MAGIC + msgpack.packb({"format": "tokenspeed-kv-events", "version": 9}),
        "record.tskv": MAGIC
        + msgpack.packb({"format": "tokenspeed-kv-events", "version": 1})
        + msgpack.packb([1, "topic-not-bytes", b"", 1.0]),
        "garbage.tskv": MAGIC
        + msgpack.packb({"format": "tokenspeed-kv-events", "version": 1})
        + b"\xc1\xc1\xc1",
    }
    for name, data in cases.items():
        if data is not None:
            (tmp_path / name).write_bytes(data)
        with pytest.raises(RecordingError) as info:
            read_recording(tmp_path / name)
        assert name in str(info.value)
        assert "\n" not in str(info.value)
