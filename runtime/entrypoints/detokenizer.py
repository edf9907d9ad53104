"""Incremental detokenisation and stop strings, for one request's stream.

Byte-level BPE tokens do not map to whole characters, so text is produced by decoding a short
window of recent tokens twice (with and without the new ones) and emitting the difference,
and only once the window no longer ends inside a multi-byte character. Each step costs a
decode of a few tokens, not of the whole output.

Stop strings are matched on the text; text that might be the start of a stop string is held
back until the next tokens show it is not, so a stop string is never emitted.
"""

from __future__ import annotations

from typing import Protocol

REPLACEMENT = "\ufffd"


class Decoder(Protocol):
    """The one tokenizer call the detokenizer needs."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas."""

    # Tokens decoded before the new ones, so the tokenizer sees the context that decides
    # spacing (e.g. a leading-space marker) the same way a full decode would.
    CONTEXT_TOKENS = 5

    def __init__(
        self, tokenizer: Decoder, prompt_ids: list[int], skip_special_tokens: bool = True
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        tail = list(prompt_ids[-self.CONTEXT_TOKENS :])
        self.ids: list[int] = tail
        self.prefix_offset = 0
        self.read_offset = len(tail)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, new_ids: list[int]) -> str:
        """Add tokens; return the text they complete (possibly empty while mid-character)."""
        self.ids.extend(new_ids)
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.ids[self.prefix_offset :])
        if len(full_text) <= len(prefix_text) or full_text.endswith(REPLACEMENT):
            return ""
        delta = full_text[len(prefix_text) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        # Keep the window short: drop everything before the prefix we still need.
        if self.prefix_offset > 64:
            drop = self.prefix_offset - self.CONTEXT_TOKENS
            del self.ids[:drop]
            self.prefix_offset -= drop
            self.read_offset -= drop
        return delta

    def flush(self) -> str:
        """Text still pending at the end of the stream (an incomplete character included)."""
        if self.read_offset >= len(self.ids):
            return ""
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return full_text[len(prefix_text) :] if len(full_text) > len(prefix_text) else ""


class StopStringMatcher:
    """Finds the first stop string in a text stream and holds back possible stop prefixes."""

    def __init__(self, stops: list[str], include: bool = False) -> None:
        """``include`` (vLLM's `include_stop_str_in_output`) releases the stop string too."""
        self.stops = [s for s in stops if s]
        self.include = include
        self.longest = max((len(s) for s in self.stops), default=0)
        self.text = ""  # text received but not yet released
        self.stopped = False

    def push(self, delta: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit now, whether a stop string was found)."""
        if self.stopped:
            return "", True
        if not self.stops:
            return delta, False
        self.text += delta
        hit = min(
            (i for i in (self.text.find(s) for s in self.stops) if i >= 0),
            default=-1,
        )
        if hit >= 0:
            self.stopped = True
            matched = next(s for s in self.stops if self.text.startswith(s, hit))
            out, self.text = self.text[: hit + (len(matched) if self.include else 0)], ""
            return out, True
        keep = self._held_back_len()
        cut = len(self.text) - keep
        out, self.text = self.text[:cut], self.text[cut:]
        return out, False

    def _held_back_len(self) -> int:
        """Length of the longest tail of the pending text that starts some stop string."""
        text = self.text
        for n in range(min(len(text), self.longest - 1), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0

    def flush(self) -> str:
        """At the end of the stream, the held-back text was not a stop string after all."""
        out, self.text = ("" if self.stopped else self.text), ""
        return out
