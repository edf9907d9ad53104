"""Finding a tag in text that arrives in pieces: release what cannot be part of it, hold the rest."""

from __future__ import annotations


def held_tail(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``tag``: those characters
    may become the tag when more text arrives, so they cannot be released yet."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class TagScanner:
    """Accumulates streamed text and splits it at the first of ``tags``.

    ``push`` returns the text before the tag that is safe to release, and whether a tag has
    been seen; then ``found`` names the tag and ``rest`` holds what followed it."""

    def __init__(self, *tags: str) -> None:
        self.tags = tags
        self.pending = ""
        self.found: str | None = None
        self.rest = ""

    def push(self, text: str) -> tuple[str, bool]:
        if self.found is not None:
            self.rest += text
            return "", True
        self.pending += text
        hits = [(at, tag) for tag in self.tags if (at := self.pending.find(tag)) >= 0]
        if hits:
            at, tag = min(hits)
            out, self.rest = self.pending[:at], self.pending[at + len(tag) :]
            self.pending, self.found = "", tag
            return out, True
        keep = max(held_tail(self.pending, tag) for tag in self.tags)
        cut = len(self.pending) - keep
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def take_rest(self) -> str:
        """The text after the tag (once found), handed over once."""
        rest, self.rest = self.rest, ""
        return rest

    def flush(self) -> str:
        """The held text, at the end of the stream (it was not a tag after all)."""
        out, self.pending = self.pending, ""
        return out
