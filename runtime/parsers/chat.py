"""One chat choice's output through the server's reasoning and tool-call parsers."""

from __future__ import annotations

from typing import Any

from tokenspeed.runtime.parsers.reasoning import ReasoningParser
from tokenspeed.runtime.parsers.tool_calls import ToolCallParser


class ChatOutputParser:
    """Turns output text into message fields: `reasoning_content`, `content`, `tool_calls`.

    Streamed (``push`` per text delta, ``finish`` at the end) it returns delta fields, tool
    calls as indexed deltas (name first, then arguments as written); whole (``message``) it
    returns the message's fields. Either
    parser may be absent; reasoning comes first, and only the answer is searched for calls.
    """

    def __init__(self, reasoning: ReasoningParser | None, tools: ToolCallParser | None) -> None:
        self.reasoning = reasoning
        self.tools = tools

    @property
    def num_calls(self) -> int:
        return len(self.tools.calls) if self.tools else 0

    def push(self, text: str) -> dict[str, Any]:
        reasoning, content = self.reasoning.push(text) if self.reasoning else ("", text)
        return self._delta(reasoning, content)

    def finish(self) -> dict[str, Any]:
        """The held-back rest, once the output has ended."""
        reasoning, content = self.reasoning.flush() if self.reasoning else ("", "")
        delta = self._delta(reasoning, content)
        tail, calls = self.tools.flush() if self.tools else ("", [])
        if tail:
            delta["content"] = delta.get("content", "") + tail
        if calls:
            delta["tool_calls"] = delta.get("tool_calls", []) + calls
        return delta

    def _delta(self, reasoning: str, content: str) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        if reasoning:
            delta["reasoning_content"] = reasoning
        calls: list[dict[str, Any]] = []
        if content and self.tools:
            content, calls = self.tools.push(content)
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        return delta

    def finish_reason(self, reason: str) -> str:
        """OpenAI's "tool_calls" when the answer made calls and ended by itself."""
        return "tool_calls" if self.num_calls and reason == "stop" else reason

    def message(self, text: str, finish: str) -> tuple[dict[str, Any], str]:
        """A whole output as the assistant message and its finish reason."""
        reasoning, content = self.reasoning.split(text) if self.reasoning else (None, text)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self.reasoning:
            message["reasoning_content"] = reasoning
        if self.tools and content:
            message["content"], calls = self.tools.read(content)
            if calls:
                message["tool_calls"] = calls
        return message, self.finish_reason(finish)
