"""The block index rebuilt from events, and the stream validator."""

from __future__ import annotations

import random

import pytest
from kv_driver import Driver, shared_prefix_workload

from tokenspeed.scheduler import rolling_hash
from tokenspeed_cli.kv_events.index import BlockIndex
from tokenspeed_cli.kv_events.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    decode_batch,
)


def rebuild(batches: list[bytes], check: bool = True) -> BlockIndex:
    index = BlockIndex(rolling_hash if check else None)
    for seq, payload in enumerate(batches):
        index.apply(decode_batch(seq, payload))
    return index


@pytest.mark.parametrize("host_pages", [0, 32])
def test_rebuilt_index_equals_the_scheduler_snapshot(rng: random.Random, host_pages: int) -> None:
    """Under eviction (and write-back to a host tier) the events give exactly the tree's blocks."""
    driver = Driver(device_pages=40, host_pages=host_pages)
    shared_prefix_workload(driver, rng)
    driver.run(rng)
    index = rebuild(driver.batches)
    summary = index.summary()
    assert summary["valid"], summary["issues"]
    assert summary["events"]["BlockRemoved"] > 0  # the pool is small enough to evict
    expected = driver.snapshot_blocks()
    assert index.live("GPU") == expected["GPU"]
    assert index.live("CPU") == expected["CPU"]
    if host_pages:
        assert expected["CPU"], "the workload should have written pages back to the host"


def test_every_prefix_is_matched_through_the_chain(rng: random.Random) -> None:
    """Stored blocks keep their parent and tokens, so the chain hashes reproduce them."""
    driver = Driver(device_pages=200)
    prompts = shared_prefix_workload(driver, rng, groups=2, per_group=3)
    driver.run(rng)
    index = rebuild(driver.batches)
    gpu = index.blocks["GPU"]
    for prompt in prompts:
        for h in rolling_hash(prompt[:-1], 4, 0):
            assert h in gpu  # nothing evicted with 200 pages
            block = gpu[h]
            assert rolling_hash(list(block.token_ids), 4, block.parent or 0) == [h]


def stream(*batches: list[object], start: int = 0) -> list[EventBatch]:
    return [EventBatch(start + i, float(i), list(events), 0) for i, events in enumerate(batches)]


def stored(hashes: list[int], parent: int | None = None, medium: str = "GPU") -> BlockStored:
    return BlockStored(hashes, parent, [0] * (2 * len(hashes)), 2, None, medium)


def test_validator_flags_gaps_unknown_removals_missing_parents_duplicates() -> None:
    batches = stream(
        [stored([1, 2])],
        [stored([3], parent=2), stored([9], parent=42)],  # 42 was never stored
        [BlockRemoved([3, 77])],  # 77 is unknown
    )
    batches.append(EventBatch(5, 5.0, [stored([1])], 0))  # 3, 4 missing; 1 already live
    batches.append(EventBatch(5, 6.0, [stored([100])], 0))  # the same batch again
    index = BlockIndex().apply_all(batches)
    s = index.summary()
    assert s["issues"] == {
        "sequence_gap": 1,
        "duplicate_batch": 1,
        "duplicate_store": 1,
        "unknown_removal": 1,
        "missing_parent": 1,
    }
    assert s["gaps"] == [[3, 4]] and s["missing_batches"] == 2
    assert not s["valid"]
    assert index.live("GPU") == {1, 2, 9}  # 100 was in the skipped duplicate batch
    assert s["blocks_stored"] == {"GPU": 5} and s["blocks_removed"] == {"GPU": 2}
    assert s["issue_examples"]["unknown_removal"] == ["batch 2: 4d not live on GPU"]


def test_parents_are_checked_per_medium_and_clear_drops_everything() -> None:
    batches = stream(
        [stored([1, 2]), stored([1], medium="CPU")],
        [stored([3], parent=2, medium="CPU")],  # 2 is on the GPU only
        [AllBlocksCleared()],
        [stored([5])],
    )
    index = BlockIndex().apply_all(batches)
    assert index.summary()["issues"] == {"missing_parent": 1}
    assert index.live("GPU") == {5} and index.live("CPU") == set()
    assert index.summary()["events"]["AllBlocksCleared"] == 1


def test_bad_lengths_and_hash_mismatches() -> None:
    good = rolling_hash([1, 2, 3, 4], 2, 0)
    batches = stream(
        [BlockStored(good, None, [1, 2, 3, 4], 2)],
        [BlockStored([123], good[-1], [5, 6], 2)],  # wrong hash for these tokens
        [BlockStored([124], None, [5, 6, 7], 2)],  # 3 tokens for one block of 2
    )
    s = BlockIndex(rolling_hash).apply_all(batches).summary()
    assert s["issues"] == {"hash_mismatch": 1, "bad_length": 1}
    assert BlockIndex().apply_all(stream(*[b.events for b in batches])).summary()["issues"] == {
        "bad_length": 1
    }


def test_joining_mid_stream_is_noted_not_a_gap() -> None:
    index = BlockIndex(expect_seq=None).apply_all(stream([stored([1])], start=7))
    s = index.summary()
    assert s["started_mid_stream"] and s["valid"] and s["first_seq"] == 7
    # A stream expected from 0 that starts at 7 lost 0..6.
    s = BlockIndex(expect_seq=0).apply_all(stream([stored([1])], start=7)).summary()
    assert s["gaps"] == [[0, 6]] and not s["started_mid_stream"]
