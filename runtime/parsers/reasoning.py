"""Reasoning parsers: a thinking model's output split into `reasoning_content` and `content`.

Qwen3 and DeepSeek-R1 (and models trained like them) think between ``<think>`` and
``</think>`` and answer after. They differ in who writes the opening tag: Qwen3's hybrid models
write it themselves when they think (and skip the block when they do not), while DeepSeek-R1's
chat template puts it in the prompt, so the output starts inside the thinking block. An output
that does start with ``<think>`` has it removed either way.
"""

from __future__ import annotations

from tokenspeed.runtime.parsers.streaming import TagScanner, held_tail

START, END = "<think>", "</think>"


class ReasoningParser:
    """Splits one output, streamed or whole; a fresh parser per sequence."""

    #: whether the output begins inside the thinking block when it does not open one itself
    starts_thinking = False

    def __init__(self) -> None:
        self._mode = "undecided"  # then "reasoning" or "content"
        self._head = ""  # undecided: the output so far (could still be the opening tag)
        self._end = TagScanner(END)

    def push(self, text: str) -> tuple[str, str]:
        """Add output text; return the (reasoning, content) that can be released now."""
        if self._mode == "undecided":
            self._head += text
            head = self._head.lstrip()
            if head.startswith(START):
                self._mode, text = "reasoning", head[len(START) :]
            elif held_tail(head, START) == len(head):  # all of it may still be the tag
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
        return reasoning, self._end.take_rest()

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


class DeepSeekR1ReasoningParser(ReasoningParser):
    """DeepSeek-R1 style: the template opened ``<think>``, the output starts by thinking."""

    starts_thinking = True


REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "qwen3": Qwen3ReasoningParser,
    "deepseek-r1": DeepSeekR1ReasoningParser,
}
