"""Reasoning parsers: a thinking model's output split into `reasoning_content` and `content`.

Most thinking models think between ``<think>`` and ``</think>`` and answer after. They differ
in who writes the opening tag: Qwen3's hybrid models write it themselves when they think (and
skip the block when they do not), while DeepSeek-R1's and Kimi K2's chat templates put it in
the prompt, so the output starts inside the thinking block. An output that does start with
the opening tag has it removed either way. Hybrid models switch thinking per request with a
chat-template argument (``enable_thinking`` for Qwen3, ``thinking`` for DeepSeek-V3.1 and
Kimi K2); a request that turns it off gets its output as content, unparsed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenspeed.runtime.parsers.streaming import TagScanner, held_tail


class ReasoningParser:
    """Splits one output, streamed or whole; a fresh parser per sequence."""

    START, END = "<think>", "</think>"
    #: whether the output begins inside the thinking block when it does not open one itself
    starts_thinking = False
    #: tags that also end the thinking block and begin the answer (they stay in the answer)
    ENDS_BEFORE: tuple[str, ...] = ()
    #: the chat-template argument that switches thinking, and its default
    switch: str | None = None
    thinks_by_default = True

    def __init__(self) -> None:
        self._mode = "undecided"  # then "reasoning" or "content"
        self._head = ""  # undecided: the output so far (could still be the opening tag)
        self._end = TagScanner(self.END, *self.ENDS_BEFORE)

    @classmethod
    def thinks(cls, template_kwargs: Mapping[str, Any] | None) -> bool:
        """Whether a request with these chat-template arguments has the model think."""
        if cls.switch is None or not template_kwargs or cls.switch not in template_kwargs:
            return cls.thinks_by_default
        return bool(template_kwargs[cls.switch])

    def push(self, text: str) -> tuple[str, str]:
        """Add output text; return the (reasoning, content) that can be released now."""
        if self._mode == "undecided":
            self._head += text
            head = self._head.lstrip()
            if head.startswith(self.START):
                self._mode, text = "reasoning", head[len(self.START) :]
            elif held_tail(head, self.START) == len(head):  # all of it may still be the tag
                return "", ""
            else:
                self._mode = "reasoning" if self.starts_thinking else "content"
                text = self._head
            self._head = ""
        if self._mode == "content":
            return "", text
        reasoning, ended = self._end.push(text)
        if not ended:
            return reasoning, ""
        self._mode = "content"
        kept = self._end.found if self._end.found in self.ENDS_BEFORE else ""
        return reasoning, kept + self._end.take_rest()

    def flush(self) -> tuple[str, str]:
        """At the end of the output: whatever was held back."""
        if self._mode == "undecided":
            head, self._head = self._head, ""
            self._mode = "reasoning" if self.starts_thinking else "content"
            return (head, "") if self.starts_thinking else ("", head)
        if self._mode == "reasoning":
            return self._end.flush(), ""
        return "", ""

    @property
    def thinking(self) -> bool:
        """Still inside the thinking block (or not yet known)."""
        return self._mode != "content"

    @classmethod
    def split(cls, text: str) -> tuple[str | None, str | None]:
        """A whole output as (reasoning_content, content); None where there is none."""
        parser = cls()
        r1, c1 = parser.push(text)
        r2, c2 = parser.flush()
        reasoning, content = r1 + r2, c1 + c2
        return (reasoning or None), (content or None)


class Qwen3ReasoningParser(ReasoningParser):
    """Qwen3 hybrid models: thinking only when the output opens ``<think>``."""

    switch = "enable_thinking"


class DeepSeekR1ReasoningParser(ReasoningParser):
    """DeepSeek-R1 style: the template opened ``<think>``, the output starts by thinking."""

    starts_thinking = True


class DeepSeekV3ReasoningParser(DeepSeekR1ReasoningParser):
    """DeepSeek-V3.1 / V3.2 hybrid models: R1-style thinking, off unless the request sets the
    template's ``thinking`` argument."""

    switch = "thinking"
    thinks_by_default = False


class KimiK2ReasoningParser(DeepSeekR1ReasoningParser):
    """Kimi K2 thinking models (K2-Thinking, K2.5): R1-style, on unless ``thinking`` is false;
    a tool-call section also ends the thinking (the model may call without closing it)."""

    ENDS_BEFORE = ("<|tool_calls_section_begin|>",)
    switch = "thinking"


class KimiReasoningParser(ReasoningParser):
    """Earlier Kimi thinking models (Kimi-VL-Thinking): ``◁think▷ ... ◁/think▷``, opened by the
    model itself."""

    START, END = "\u25c1think\u25b7", "\u25c1/think\u25b7"


REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "qwen3": Qwen3ReasoningParser,
    "deepseek-r1": DeepSeekR1ReasoningParser,
    "deepseek-v3": DeepSeekV3ReasoningParser,
    "kimi_k2": KimiK2ReasoningParser,
    "kimi": KimiReasoningParser,
}
