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
    """Accumulates streamed text and splits it at the first ``tag``.

    ``push`` returns the text before the tag that is safe to release, and whether the tag has
    been seen; after the tag, ``rest`` holds what followed it."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.pending = ""
        self.found = False
        self.rest = ""

    def push(self, text: str) -> tuple[str, bool]:
        if self.found:
            self.rest += text
            return "", True
        self.pending += text
        at = self.pending.find(self.tag)
        if at >= 0:
            out, self.rest = self.pending[:at], self.pending[at + len(self.tag) :]
            self.pending, self.found = "", True
            return out, True
        keep = held_tail(self.pending, self.tag)
        cut = len(self.pending) - keep
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def take_rest(self) -> str:
        """The text after the tag (once found), handed over once."""
        rest, self.rest = self.rest, ""
        return rest

    def flush(self) -> str:
        """The held text, at the end of the stream (it was not the tag after all)."""
        out, self.pending = self.pending, ""
        return out
