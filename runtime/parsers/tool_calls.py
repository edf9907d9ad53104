"""Tool-call parsers: the calls a model writes into its answer, as OpenAI `tool_calls`.

Qwen2.5 and Qwen3 (and Hermes-style models) write each call as a JSON object between
``<tool_call>`` and ``</tool_call>``: ``{"name": ..., "arguments": {...}}``. Text before the
first call is the message's content. Streamed, content flows until a call opens; each call is
sent whole once it closes (clients accumulate `tool_calls` deltas either way).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from tokenspeed.runtime.parsers.streaming import TagScanner


def tool_call(name: str, arguments: str) -> dict[str, Any]:
    """One entry of `message.tool_calls` (a fresh call id)."""
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


class HermesToolParser:
    """``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks; a fresh one per
    sequence."""

    START, END = "<tool_call>", "</tool_call>"

    def __init__(self) -> None:
        self._scan = TagScanner(self.START)  # looking for the next call
        self._call: TagScanner | None = None  # inside a call, looking for its end
        self._body = ""  # the open call's text so far
        self.calls: list[dict[str, Any]] = []
        self._text_after_calls = ""  # anything but whitespace here is kept as content

    def push(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """Add content text; return (content to release, calls completed by it)."""
        content, done = "", []
        while text:
            if self._call is None:
                before, opened = self._scan.push(text)
                if self.calls:  # text between or after calls
                    self._text_after_calls += before
                else:
                    content += before
                if not opened:
                    return content, done
                text, self._scan = self._scan.take_rest(), TagScanner(self.START)
                self._call = TagScanner(self.END)
            body, closed = self._call.push(text)
            self._body += body
            if not closed:
                return content, done
            body, self._body = self._body, ""
            call = _parse_call(body)
            text = self._call.take_rest()
            self._call = None
            if call is None:  # not a call after all: keep it as text
                content += self.START + body + self.END
            else:
                self.calls.append(call)
                done.append(call)
        return content, done

    def flush(self) -> str:
        """At the end: text that was held back, or a call that never closed, as content."""
        tail = self._scan.flush()
        if self._call is not None:
            tail += self.START + self._body + self._call.flush()
            self._call, self._body = None, ""
        if not self.calls:
            return tail
        extra = (self._text_after_calls + tail).strip()
        return extra

    @classmethod
    def parse(cls, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """A whole answer as (content or None, tool calls)."""
        parser = cls()
        content, calls = parser.push(text)
        content += parser.flush()
        if calls:
            content = content.strip()
        return (content or None), calls


def _parse_call(body: str) -> dict[str, Any] | None:
    """One call's JSON as an OpenAI tool call, or None if it is not one."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return tool_call(obj["name"], arguments)


TOOL_CALL_PARSERS: dict[str, type[HermesToolParser]] = {
    "qwen25": HermesToolParser,
    "hermes": HermesToolParser,
}
