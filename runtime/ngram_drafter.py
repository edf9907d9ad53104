"""N-gram drafts for speculative decoding (`--speculative-algorithm NGRAM`, prompt lookup).

Agentic and editing traffic repeats itself: a model quotes the file it was shown, the tool
output it read, the code it is rewriting. The drafter looks for an earlier occurrence of a
request's last few tokens in its own history (prompt and output) and proposes the tokens that
followed it; the target model then checks them all in one forward. No second model, no extra
weights.

A search over each history would cost time in proportion to its length, per request and per
step: 60-70 us a request on the development VM once suffixes repeat (tens of milliseconds a
step at hundreds of requests). So the drafter keeps an index instead, per pool slot and per
match length (4, 3 and 2 tokens): a hash table from an n-gram's bucket to the position after
its latest occurrence. A step adds the n-grams its new tokens complete, and a proposal reads
one bucket per match length and checks the tokens there, all of it numpy over every request
of the step at once. A bucket holds one n-gram, the latest to land in it, so an n-gram whose
bucket a later different n-gram took is forgotten and the lookup falls back to a shorter
match; with ``BUCKETS`` buckets that is rare for what occurred in the last few thousand tokens.
"""

from __future__ import annotations

import numpy as np

from tokenspeed.runtime.drafting import Drafts, StepRecord, TokenHistory
from tokenspeed.runtime.forward_batch import segments

#: match lengths tried, longest first: a longer match predicts better
MATCH_LENGTHS = (4, 3, 2)
#: buckets per slot and match length (a power of two): 3 x 128 KiB of int32 per slot in use
BUCKETS = 1 << 15

_LONGEST = max(MATCH_LENGTHS)
_SHORTEST = min(MATCH_LENGTHS)
# odd 64-bit multipliers, one per token of an n-gram counted from its end, then one to mix the
# sum (multiply-shift hashing): an n-gram's sum extends the sum of its own suffix, so one pass
# over a position's last tokens hashes all the match lengths
_WEIGHTS = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                     0xD6E8FEB86659FD93], dtype=np.uint64)[:_LONGEST]  # fmt: skip
_MIX = np.uint64(0xFF51AFD7ED558CCD)


def _suffix_buckets(last: list[np.ndarray], buckets: int) -> list[np.ndarray]:
    """For n-grams given by their tokens from the end (``last[j]``: each n-gram's token ``j``
    places before its end), the bucket of each of ``MATCH_LENGTHS``' suffixes. The top bits of
    the mixed sum are the bucket (uint64 arithmetic wraps), so nearby ids land far apart."""
    shift = np.uint64(64 - (buckets.bit_length() - 1))
    out: dict[int, np.ndarray] = {}
    with np.errstate(over="ignore"):  # one n-gram makes numpy scalars, which warn on wrap
        acc = np.zeros(np.shape(last[0]), dtype=np.uint64)
        for j in range(_LONGEST):
            acc = acc + np.asarray(last[j]).astype(np.uint64) * _WEIGHTS[j]
            if j + 1 in MATCH_LENGTHS:
                out[j + 1] = ((acc * _MIX) >> shift).astype(np.int64)
    return [out[m] for m in MATCH_LENGTHS]


def ngram_buckets(grams: np.ndarray, buckets: int) -> np.ndarray:
    """The bucket of each row of ``grams[..., n]`` (token ids, ``n`` in ``MATCH_LENGTHS``)."""
    g = np.asarray(grams)
    n = g.shape[-1]
    last = [g[..., n - 1 - j] if j < n else np.zeros(g.shape[:-1], g.dtype)
            for j in range(_LONGEST)]  # fmt: skip
    return _suffix_buckets(last, buckets)[MATCH_LENGTHS.index(n)]


class NgramDrafter(TokenHistory):
    """Per-slot token histories, their n-gram index, and the drafts they suggest."""

    def __init__(self, capacity: int, buckets: int = BUCKETS) -> None:
        super().__init__(capacity)
        if buckets < 2 or buckets & (buckets - 1):
            raise ValueError(f"buckets must be a power of two, not {buckets}")
        self.buckets = buckets
        # [match length, slot, bucket] -> 1 + the position right after the bucket's latest
        # n-gram (0: empty). np.zeros maps pages lazily: a slot never used costs nothing.
        self._heads = np.zeros((len(MATCH_LENGTHS), max(1, capacity), buckets), dtype=np.int32)

    # ---- the index ------------------------------------------------------------------------------
    def install(self, slot: int, tokens: list[int]) -> None:
        """A request's history now lives in ``slot``: its n-grams replace the slot's index."""
        super().install(slot, tokens)
        if slot >= self._heads.shape[1]:
            rows = max(slot + 1, 2 * self._heads.shape[1])
            heads = np.zeros((len(MATCH_LENGTHS), rows, self.buckets), dtype=np.int32)
            heads[:, : self._heads.shape[1]] = self._heads
            self._heads = heads
        self._heads[:, slot] = 0
        n = len(tokens)
        if n > _SHORTEST:  # the history's n-grams as slices of its row: no gathers
            row = np.concatenate([np.zeros(_LONGEST, np.int32), self._buf[slot, :n]])
            last = [
                row[_LONGEST + _SHORTEST - 1 - j : _LONGEST + n - 1 - j] for j in range(_LONGEST)
            ]
            self._add(np.int64(slot), np.arange(_SHORTEST, n), last)

    def append_many(self, slots: np.ndarray, counts: np.ndarray, tokens: np.ndarray) -> None:
        """Tokens a step's requests gained, and the n-grams they complete into the index."""
        slots = np.asarray(slots, dtype=np.int64)
        before = self.lengths(slots)
        super().append_many(slots, counts, tokens)
        self._index(slots, before, self.lengths(slots))

    def observe(self, step: StepRecord) -> None:
        """The history (and with it the index) grows by what each request gained."""
        self.observe_tokens(step)

    def _last_tokens(self, slots: np.ndarray, ends: np.ndarray) -> list[np.ndarray]:
        """``slots[i]``'s token ``j + 1`` places before ``ends[i]``, for each ``j`` below the
        longest match (position 0 where that is before the history's start)."""
        flat, base = self._buf.reshape(-1), slots * self._buf.shape[1]
        return [flat[base + np.maximum(ends - 1 - j, 0)] for j in range(_LONGEST)]

    def _cells(self, slots: np.ndarray, buckets: list[np.ndarray]) -> list[np.ndarray]:
        """Flat indices into the tables of each match length."""
        rows = self._heads.shape[1]
        return [(k * rows + slots) * self.buckets + b for k, b in enumerate(buckets)]

    def _index(self, slots: np.ndarray, old: np.ndarray, new: np.ndarray) -> None:
        """Add the n-grams of each slot that a token now follows and did not before: those
        ending (exclusively) at ``e`` for ``old <= e < new``. Later ones win their bucket."""
        lo = np.maximum(old, _SHORTEST)
        owner, within = segments(np.maximum(new - lo, 0))
        if not len(owner):
            return
        rows, ends = slots[owner], lo[owner] + within
        self._add(rows, ends, self._last_tokens(rows, ends))

    def _add(self, rows: np.ndarray, ends: np.ndarray, last: list[np.ndarray]) -> None:
        """Index the n-grams ending (exclusively) at ``ends`` of slots ``rows`` (one slot or
        one per end), given their last tokens (``_last_tokens``' layout)."""
        buckets = _suffix_buckets(last, self.buckets)
        cells = np.concatenate(np.broadcast_arrays(*self._cells(rows, buckets)))
        # an n-gram longer than the history before ``e`` adds 0, which changes nothing
        after = np.concatenate([np.where(ends >= m, ends + 1, 0) for m in MATCH_LENGTHS])
        # maximum, not assignment: two n-grams of one step may share a bucket (and ufunc.at
        # is fast on a flat index only)
        np.maximum.at(self._heads.reshape(-1), cells, after.astype(np.int32))

    # ---- drafts ---------------------------------------------------------------------------------
    def propose(
        self, slots: np.ndarray, positions: np.ndarray, tables: np.ndarray, count: int
    ) -> Drafts:
        """Up to ``count`` tokens for each slot: those that followed the latest indexed
        occurrence of its history's last tokens, the longest match (4, 3, then 2 tokens)
        winning; none where not even the last 2 tokens occurred before. Positions and pages
        are not needed."""
        del positions, tables
        slots = np.asarray(slots, dtype=np.int64)
        lens = self.lengths(slots)
        found = np.full(len(slots), -1, dtype=np.int64)  # where the chosen match ends
        # only an installed history longer than the shortest match can have one (and only an
        # installed slot has rows in the tables)
        live = np.flatnonzero(lens > _SHORTEST) if count > 0 else np.zeros(0, np.int64)
        if len(live):
            rows, size = slots[live], lens[live]
            tail = self._last_tokens(rows, size)
            cells = self._cells(rows, _suffix_buckets(tail, self.buckets))
            heads = self._heads.reshape(-1)
            ends = np.stack([heads[c] for c in cells], axis=1).astype(np.int64) - 1  # [R, K]
            # the tokens before each candidate end, against the history's last tokens
            back = np.maximum(ends[:, :, None] - 1 - np.arange(_LONGEST), 0)
            seen = self._buf.reshape(-1)[(rows * self._buf.shape[1])[:, None, None] + back]
            same = seen == np.stack(tail, axis=1)[:, None, :]
            needed = np.arange(_LONGEST) < np.array(MATCH_LENGTHS)[:, None]  # [K, longest]
            hit = (same | ~needed).all(axis=2) & (ends >= np.array(MATCH_LENGTHS))
            first = hit.argmax(axis=1)  # the longest match that holds
            found[live] = np.where(hit.any(axis=1), ends[np.arange(len(live)), first], -1)
        take = np.where(found >= 0, np.minimum(max(count, 0), lens - found), 0)
        owner, within = segments(take)
        return Drafts(take, self._buf[slots[owner], found[owner] + within].astype(np.int64))

    def propose_one(self, slot: int, count: int) -> np.ndarray:
        """``propose`` for one slot: its drafts."""
        none = np.zeros(1, dtype=np.int64)
        return self.propose(np.array([slot]), none, none[:, None], count).tokens
