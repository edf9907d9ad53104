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


@dataclass
class StepRecord:
    """One executed step, per request of the scheduler's op (``R`` of them).

    Request ``i`` consumed ``valid[i]`` inputs whose KV is kept, at positions
    ``starts[i] ..``, with hidden states ``hidden[row_starts[i] ..]``. It gained
    ``new_tokens[i]`` (sampled, or accepted drafts and the bonus token; empty for a prefill
    chunk that sampled nothing)."""

    slots: np.ndarray  # [R] pool slots
    starts: np.ndarray  # [R] position of each request's first input this step
    valid: np.ndarray  # [R] inputs whose KV the step kept
    row_starts: np.ndarray  # [R] index of the first of them among the step's rows
    new_tokens: list[np.ndarray]  # [R] tokens gained
    tables: np.ndarray  # [R, pages] block tables
    hidden: torch.Tensor | None  # [T, hidden] the target's final (normed) hidden states
    decode: bool  # the step was a decode (every request's inputs are a short block)


class Drafter(Protocol):
    """Proposes drafts per request and learns from every executed step."""

    def install(self, slot: int, tokens: list[int]) -> None:
        """A request's history (prompt and output so far) now lives in ``slot``."""

    def propose(
        self, slots: np.ndarray, positions: np.ndarray, tables: np.ndarray, count: int
    ) -> list[np.ndarray]:
        """Up to ``count`` drafts for each decode request (last token at ``positions``; pages
        ``tables``, which hold positions up to ``positions + count``)."""
        ...

    def observe(self, step: StepRecord) -> None:
        """Learn what the step kept and sampled."""


class TokenHistory:
    """Each pool slot's tokens (prompt then output) in a growing numpy buffer."""

    def __init__(self, capacity: int) -> None:
        self._tokens: list[np.ndarray | None] = [None] * capacity
        self._lens = np.zeros(capacity, dtype=np.int64)

    def _grow(self, capacity: int) -> None:
        self._tokens += [None] * (capacity - len(self._tokens))
        lens = np.zeros(capacity, dtype=np.int64)
        lens[: len(self._lens)] = self._lens
        self._lens = lens

    def install(self, slot: int, tokens: list[int]) -> None:
        """A request's history (prompt and output so far) now lives in ``slot``."""
        if slot >= len(self._tokens):
            self._grow(max(slot + 1, 2 * len(self._tokens)))
        buf = np.empty(max(64, 2 * len(tokens)), dtype=np.int64)
        buf[: len(tokens)] = tokens
        self._tokens[slot] = buf
        self._lens[slot] = len(tokens)

    def append(self, slot: int, tokens: np.ndarray) -> None:
        """Tokens the request gained this step."""
        buf, n = self._tokens[slot], int(self._lens[slot])
        if buf is None:
            return
        if n + len(tokens) > len(buf):
            bigger = np.empty(2 * (n + len(tokens)), dtype=np.int64)
            bigger[:n] = buf[:n]
            buf = self._tokens[slot] = bigger
        buf[n : n + len(tokens)] = tokens
        self._lens[slot] = n + len(tokens)

    def tokens(self, slot: int) -> np.ndarray:
        """The slot's history (a view: valid until the next ``append``)."""
        buf = self._tokens[slot]
        return np.zeros(0, dtype=np.int64) if buf is None else buf[: int(self._lens[slot])]

    def observe_tokens(self, step: StepRecord) -> None:
        """Append every request's gained tokens."""
        for slot, new in zip(step.slots.tolist(), step.new_tokens, strict=True):
            if len(new):
                self.append(slot, new)
