"""N-gram drafts for speculative decoding (`--speculative-algorithm NGRAM`, prompt lookup).

Agentic and editing traffic repeats itself: a model quotes the file it was shown, the tool
output it read, the code it is rewriting. The drafter looks for the latest earlier occurrence
of a request's last few tokens in its own history (prompt and output) and proposes the tokens
that followed it; the target model then checks them all in one forward. No second model, no
extra weights.

Each pool slot keeps its request's tokens in a row of the drafter's history array, so drafting
is a few vectorised comparisons over the recent history, not a Python walk over tokens.
"""

from __future__ import annotations

import numpy as np

from tokenspeed.runtime.drafting import StepRecord, TokenHistory

#: match lengths tried, longest first: a longer match predicts better
MATCH_LENGTHS = (4, 3, 2)
#: how far back a match is looked for (bounds the per-step cost on very long contexts)
SEARCH_WINDOW = 32768


class NgramDrafter(TokenHistory):
    """Per-slot token histories and the drafts they suggest."""

    def propose_one(self, slot: int, count: int) -> np.ndarray:
        """Up to ``count`` tokens that followed the latest earlier occurrence of the history's
        last tokens, the longest match (up to ``MATCH_LENGTHS[0]`` tokens) winning; empty
        when not even the last ``MATCH_LENGTHS[-1]`` tokens occurred before.

        One pass over the window finds where the last two tokens occurred before (a token
        follows each); the longer matches are then checked at those few places only."""
        history = self.tokens(slot)
        n = len(history)
        shortest, longest = MATCH_LENGTHS[-1], MATCH_LENGTHS[0]
        if count <= 0 or n <= shortest:
            return np.zeros(0, dtype=np.int64)
        hist = history[max(0, n - SEARCH_WINDOW) :]
        size = len(hist)
        # ends e (exclusive) with hist[e - 2 : e] == the last two tokens and e < size
        ends = np.flatnonzero((hist[: size - 2] == hist[-2]) & (hist[1 : size - 1] == hist[-1]))
        if not len(ends):
            return np.zeros(0, dtype=np.int64)
        ends = ends + 2
        length = np.full(len(ends), 2, dtype=np.int64)
        alive = np.ones(len(ends), dtype=bool)
        for back in range(3, longest + 1):  # does the match reach `back` tokens?
            start = ends - back
            ok = alive & (start >= 0)
            ok[ok] = hist[start[ok]] == hist[size - back]
            length[ok] = back
            alive = ok
        best = np.flatnonzero(length == length.max())[-1]  # the longest, then the latest
        if length[best] < shortest:
            return np.zeros(0, dtype=np.int64)
        follow = int(ends[best])
        return hist[follow : follow + count].astype(np.int64)

    def propose(
        self, slots: np.ndarray, positions: np.ndarray, tables: np.ndarray, count: int
    ) -> list[np.ndarray]:
        """``propose_one`` for each slot (positions and pages are not needed)."""
        del positions, tables
        return [self.propose_one(slot, count) for slot in slots.tolist()]

    def observe(self, step: StepRecord) -> None:
        """The history grows by what each request gained."""
        self.observe_tokens(step)
