"""Rebuilding the block index from a KV-event stream, validating the stream as it goes.

`BlockIndex` applies batches in sequence order and keeps, per medium ("GPU", "CPU"), the live
blocks: hash -> parent hash, tokens and block size. Anything a correct publisher never does is
recorded as an issue rather than raised, so one bad event does not hide the rest:

- ``sequence_gap``: a batch number was skipped (batches were lost; the index may be stale);
- ``duplicate_batch``: a batch number seen before, or going backwards (it is skipped);
- ``duplicate_store``: a block stored again on a medium where it is already live;
- ``unknown_removal``: a block removed from a medium where it is not live;
- ``missing_parent``: a stored chain whose parent is not live on the same medium (a page's
  prefix must be cached wherever the page is: TokenSpeed keeps each tier a rooted subtree);
- ``bad_length``: ``len(token_ids) != len(block_hashes) * block_size``;
- ``hash_mismatch`` (only with ``check_hashes``): the hashes are not TokenSpeed's chained
  ``rolling_hash`` of the tokens.

A consumer that joined mid-stream without replay (``started_mid_stream``) can expect unknown
removals and missing parents for blocks stored before it joined.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tokenspeed_cli.kv_events.wire import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    EventBatch,
)

#: How many example issues of each kind are kept (counts are always complete).
MAX_EXAMPLES = 5

ISSUE_KINDS = (
    "sequence_gap",
    "duplicate_batch",
    "duplicate_store",
    "unknown_removal",
    "missing_parent",
    "bad_length",
    "hash_mismatch",
)


@dataclass(frozen=True)
class Block:
    """One live block: its parent's hash (None at the root), its tokens and the block size."""

    parent: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int


@dataclass
class StreamStats:
    """What the stream contained and what was wrong with it."""

    batches: int = 0
    events: Counter[str] = field(default_factory=Counter)
    stored: Counter[str] = field(default_factory=Counter)  # blocks stored, by medium
    removed: Counter[str] = field(default_factory=Counter)  # blocks removed, by medium
    first_seq: int | None = None
    last_seq: int | None = None
    first_ts: float | None = None
    last_ts: float | None = None
    missing_batches: int = 0
    gaps: list[tuple[int, int]] = field(default_factory=list)  # (first missing, last missing)
    issues: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    block_sizes: set[int] = field(default_factory=set)
    dp_ranks: set[int] = field(default_factory=set)
    started_mid_stream: bool = False


HashCheck = Callable[[list[int], int, int], list[int]]


class BlockIndex:
    """The live blocks per medium, rebuilt from event batches; see the module docstring."""

    def __init__(self, check_hashes: HashCheck | None = None, expect_seq: int | None = 0) -> None:
        """`check_hashes` is `rolling_hash(tokens, block_size, parent)` to verify hash chains.

        `expect_seq` is the first sequence number expected (0 for a stream from its start);
        None accepts whatever comes first and marks the stream as joined mid-way if it is not 0.
        """
        self.blocks: dict[str, dict[BlockHash, Block]] = {}
        self.stats = StreamStats()
        self._check_hashes = check_hashes
        self._expect = expect_seq

    # ---- queries --------------------------------------------------------------------------
    def live(self, medium: str | None = None) -> set[BlockHash]:
        """Live block hashes on `medium` (all media when None)."""
        if medium is not None:
            return set(self.blocks.get(medium, {}))
        return {h for tier in self.blocks.values() for h in tier}

    def live_counts(self) -> dict[str, int]:
        """Live blocks per medium."""
        return {m: len(tier) for m, tier in sorted(self.blocks.items())}

    @property
    def block_size(self) -> int | None:
        """The stream's block size when it used exactly one."""
        sizes = self.stats.block_sizes
        return next(iter(sizes)) if len(sizes) == 1 else None

    # ---- applying -------------------------------------------------------------------------
    def apply_all(self, batches: Iterable[EventBatch]) -> BlockIndex:
        """Apply batches in order; returns self."""
        for batch in batches:
            self.apply(batch)
        return self

    def apply(self, batch: EventBatch) -> bool:
        """Apply one batch; False when it was a duplicate (and skipped)."""
        st = self.stats
        last = st.last_seq
        if last is not None and batch.seq <= last:
            self._issue("duplicate_batch", f"batch {batch.seq} after batch {last}")
            return False
        expected = self._expect if last is None else last + 1
        if expected is None:
            st.started_mid_stream = batch.seq != 0
        elif batch.seq > expected:
            st.missing_batches += batch.seq - expected
            st.gaps.append((expected, batch.seq - 1))
            self._issue("sequence_gap", f"batches {expected}..{batch.seq - 1} missing")
        if st.first_seq is None:
            st.first_seq, st.first_ts = batch.seq, batch.ts
        st.last_seq, st.last_ts = batch.seq, batch.ts
        st.batches += 1
        if batch.dp_rank is not None:
            st.dp_ranks.add(batch.dp_rank)
        for event in batch.events:
            st.events[type(event).__name__] += 1
            if isinstance(event, BlockStored):
                self._stored(event, batch.seq)
            elif isinstance(event, BlockRemoved):
                self._removed(event, batch.seq)
            elif isinstance(event, AllBlocksCleared):
                self.blocks.clear()
        return True

    def _stored(self, e: BlockStored, seq: int) -> None:
        st = self.stats
        size = e.block_size
        st.block_sizes.add(size)
        tier = self.blocks.setdefault(e.medium, {})
        n = len(e.block_hashes)
        if len(e.token_ids) != n * size:
            self._issue("bad_length", f"batch {seq}: {len(e.token_ids)} tokens for {n} blocks "
                                      f"of {size}")  # fmt: skip
        if e.parent_block_hash is not None and e.parent_block_hash not in tier:
            self._issue("missing_parent", f"batch {seq}: parent {_short(e.parent_block_hash)} "
                                          f"not live on {e.medium}")  # fmt: skip
        if self._check_hashes is not None and len(e.token_ids) == n * size:
            self._verify_chain(e, seq)
        parent = e.parent_block_hash
        for i, h in enumerate(e.block_hashes):
            if h in tier:
                self._issue("duplicate_store", f"batch {seq}: {_short(h)} already live "
                                               f"on {e.medium}")  # fmt: skip
            tokens = tuple(e.token_ids[i * size : (i + 1) * size])
            tier[h] = Block(parent, tokens, size)
            parent = h
        st.stored[e.medium] += n

    def _verify_chain(self, e: BlockStored, seq: int) -> None:
        assert self._check_hashes is not None
        parent = e.parent_block_hash
        if not all(isinstance(h, int) for h in e.block_hashes) or not isinstance(
            parent, int | None
        ):
            self._issue("hash_mismatch", f"batch {seq}: hashes are not integers")
            return
        expected = self._check_hashes(e.token_ids, e.block_size, parent or 0)
        if expected != e.block_hashes:
            self._issue("hash_mismatch", f"batch {seq}: chain from {_short(parent)} does not "
                                         "match the tokens")  # fmt: skip

    def _removed(self, e: BlockRemoved, seq: int) -> None:
        tier = self.blocks.setdefault(e.medium, {})
        for h in e.block_hashes:
            if tier.pop(h, None) is None:
                self._issue("unknown_removal", f"batch {seq}: {_short(h)} not live on {e.medium}")
        self.stats.removed[e.medium] += len(e.block_hashes)

    def _issue(self, kind: str, detail: str) -> None:
        self.stats.issues[kind] += 1
        examples = self.stats.examples.setdefault(kind, [])
        if len(examples) < MAX_EXAMPLES:
            examples.append(detail)

    # ---- reporting ------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Statistics and validation results as plain data (the `--json` output)."""
        st = self.stats
        has_ts = st.first_ts is not None and st.last_ts is not None
        span = st.last_ts - st.first_ts if has_ts else 0.0  # type: ignore[operator]
        return {
            "batches": st.batches,
            "first_seq": st.first_seq,
            "last_seq": st.last_seq,
            "time_span_s": round(span, 6),
            "started_mid_stream": st.started_mid_stream,
            "events": dict(st.events),
            "blocks_stored": dict(st.stored),
            "blocks_removed": dict(st.removed),
            "blocks_live": self.live_counts(),
            "block_sizes": sorted(st.block_sizes),
            "dp_ranks": sorted(st.dp_ranks),
            "missing_batches": st.missing_batches,
            "gaps": [list(g) for g in st.gaps],
            "issues": {k: st.issues[k] for k in ISSUE_KINDS if st.issues[k]},
            "issue_examples": {k: v for k, v in st.examples.items() if v},
            "valid": not st.issues,
        }


def _short(h: BlockHash | None) -> str:
    """A hash for messages: hex, shortened."""
    if h is None:
        return "root"
    text = h.hex() if isinstance(h, bytes) else f"{h:x}"
    return text if len(text) <= 12 else text[:12] + "…"
