"""What a speculative-decoding drafter sees of each step, and the interface every drafter has.

A drafter proposes tokens for the next decode step of each request and learns from each step
the executor ran. The executor verifies the proposals itself (``ModelExecutor._verify``), so a
drafter may be wrong at no cost to exactness: a bad draft only costs the position it used.

* NGRAM (``ngram_drafter.py``) needs only the tokens each request gained.
* MTP (``mtp_drafter.py``) also runs the checkpoint's multi-token-prediction layer over every
  position whose KV the step kept, from the target model's hidden states there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from tokenspeed.runtime.forward_batch import segments


@dataclass
class StepRecord:
    """One executed step, per request of the scheduler's op (``R`` of them).

    Request ``i`` consumed ``valid[i]`` inputs whose KV is kept, at positions
    ``starts[i] ..``, with hidden states ``hidden[row_starts[i] ..]``. It gained
    ``gained[i]`` tokens (sampled, or accepted drafts and the bonus token; none for a prefill
    chunk that sampled nothing): ``gained_tokens`` holds them, request after request."""

    slots: np.ndarray  # [R] pool slots
    starts: np.ndarray  # [R] position of each request's first input this step
    valid: np.ndarray  # [R] inputs whose KV the step kept
    row_starts: np.ndarray  # [R] index of the first of them among the step's rows
    gained: np.ndarray  # [R] tokens gained
    gained_tokens: np.ndarray  # [sum(gained)] those tokens, in request order
    tables: np.ndarray  # [R, pages] block tables
    hidden: torch.Tensor | None  # [T, hidden] the target's final (normed) hidden states
    decode: bool  # the step was a decode (every request's inputs are a short block)


@dataclass
class Drafts:
    """Each request's drafts laid end to end: request ``i`` has the ``lens[i]`` tokens after
    the first ``lens[:i].sum()``. One array, not one per request, so that a step's verify
    blocks are laid out without a Python pass over its requests."""

    lens: np.ndarray  # [R] int64, 0 for a request without drafts
    tokens: np.ndarray  # [sum(lens)] int64

    def per_request(self) -> list[np.ndarray]:
        """One array per request (for tests and logs; the step path keeps them flat)."""
        return np.split(self.tokens, np.cumsum(self.lens)[:-1]) if len(self.lens) else []


class Drafter(Protocol):
    """Proposes drafts per request and learns from every executed step."""

    def install(self, slot: int, tokens: list[int]) -> None:
        """A request's history (prompt and output so far) now lives in ``slot``."""

    def propose(
        self, slots: np.ndarray, positions: np.ndarray, tables: np.ndarray, count: int
    ) -> Drafts:
        """Up to ``count`` drafts for each decode request (last token at ``positions``; pages
        ``tables``, which hold positions up to ``positions + count``)."""
        ...

    def observe(self, step: StepRecord) -> None:
        """Learn what the step kept and sampled."""


class TokenHistory:
    """Each pool slot's tokens (prompt then output) as a row of one growing 2-D array.

    One array, not a buffer per slot, so a step's appends and the MTP layer's reads of the
    tokens after each kept position are a numpy scatter and gather over all its requests
    (vLLM's input batch keeps token ids the same way). Rows and width grow by doubling, to
    the longest history seen; token ids are int32, so 256 slots of 128k tokens take 128 MiB
    of host memory.
    """

    def __init__(self, capacity: int) -> None:
        self._buf = np.zeros((max(1, capacity), 64), dtype=np.int32)
        self._lens = np.zeros(max(1, capacity), dtype=np.int64)
        self._installed = np.zeros(max(1, capacity), dtype=bool)

    def _ensure(self, rows: int, width: int) -> None:
        """Room for ``rows`` slots of ``width`` tokens (each axis at least doubles)."""
        have_rows, have_width = self._buf.shape
        if rows <= have_rows and width <= have_width:
            return
        new_rows = max(rows, 2 * have_rows) if rows > have_rows else have_rows
        new_width = max(width, 2 * have_width) if width > have_width else have_width
        buf = np.zeros((new_rows, new_width), dtype=np.int32)
        buf[:have_rows, :have_width] = self._buf
        self._buf = buf
        if new_rows > have_rows:
            more = new_rows - have_rows
            self._lens = np.concatenate([self._lens, np.zeros(more, dtype=np.int64)])
            self._installed = np.concatenate([self._installed, np.zeros(more, dtype=bool)])

    def install(self, slot: int, tokens: list[int]) -> None:
        """A request's history (prompt and output so far) now lives in ``slot``."""
        self._ensure(slot + 1, len(tokens))
        self._buf[slot, : len(tokens)] = tokens
        self._lens[slot] = len(tokens)
        self._installed[slot] = True

    def append(self, slot: int, tokens: np.ndarray) -> None:
        """Tokens one request gained (``append_many`` appends a step's)."""
        self.append_many(np.array([slot]), np.array([len(tokens)]), np.asarray(tokens))

    def append_many(self, slots: np.ndarray, counts: np.ndarray, tokens: np.ndarray) -> None:
        """Tokens a step's requests gained: ``counts[i]`` for ``slots[i]`` (each slot at
        most once), ``tokens`` request after request. A slot never installed keeps none."""
        slots = np.asarray(slots, dtype=np.int64)
        counts = np.asarray(counts, dtype=np.int64)
        if not len(slots) or not counts.any():
            return
        self._ensure(int(slots.max()) + 1, 0)
        owner, within = segments(counts)
        installed = self._installed[slots]
        if not installed.all():
            keep = installed[owner]
            owner, within, tokens = owner[keep], within[keep], np.asarray(tokens)[keep]
            counts = np.where(installed, counts, 0)
        lens = self._lens[slots]
        self._ensure(0, int((lens + counts).max()))
        self._buf[slots[owner], lens[owner] + within] = tokens
        self._lens[slots] = lens + counts

    def tokens(self, slot: int) -> np.ndarray:
        """The slot's history (a view: valid until the history next grows)."""
        if slot >= len(self._lens) or not self._installed[slot]:
            return np.zeros(0, dtype=np.int32)
        return self._buf[slot, : int(self._lens[slot])]

    def lengths(self, slots: np.ndarray) -> np.ndarray:
        """Each slot's history length (0 for a slot never installed)."""
        slots = np.asarray(slots, dtype=np.int64)
        self._ensure(int(slots.max()) + 1 if len(slots) else 0, 0)
        return np.where(self._installed[slots], self._lens[slots], 0)

    def gather(self, slots: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The token at ``positions[i]`` of slot ``slots[i]``'s history (within its length)."""
        return self._buf[slots, positions].astype(np.int64)

    def observe_tokens(self, step: StepRecord) -> None:
        """Append every request's gained tokens."""
        self.append_many(step.slots, step.gained, step.gained_tokens)
