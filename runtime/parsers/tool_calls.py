"""Tool-call parsers: the calls a model writes into its answer, as OpenAI `tool_calls`.

Each family marks a call with its own tags, and some wrap all of an answer's calls in a section:

- Hermes / Qwen2.5 / Qwen3: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
- DeepSeek-V3: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`` then the
  arguments in a fenced ```json block, ``<｜tool▁call▁end｜>`` ... ``<｜tool▁calls▁end｜>``;
- DeepSeek-V3.1: the same tags with ``NAME<｜tool▁sep｜>ARGUMENTS`` inside a call;
- Kimi K2: ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0``
  ``<|tool_call_argument_begin|>ARGUMENTS<|tool_call_end|>`` ... ``<|tool_calls_section_end|>``.

Text before the first call is the message's content. Streamed, content flows until a call
opens; a call's name is sent as soon as it is written and its arguments stream as the model
writes them (clients accumulate `tool_calls` deltas by index), as in vLLM. Where the tags are special tokens (DeepSeek, Kimi), the server keeps special tokens in
such requests' text so the parser can see them (``needs_special_tokens``).
"""

from __future__ import annotations

import abc
import json
import re
import uuid
from typing import Any

from tokenspeed.runtime.parsers.streaming import TagScanner


def tool_call(name: str, arguments: str, call_id: str | None = None) -> dict[str, Any]:
    """One entry of `message.tool_calls` (a fresh call id unless the model named one)."""
    return {
        "id": call_id or f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _arguments_text(arguments: Any) -> str:
    """Arguments as the JSON text OpenAI's `function.arguments` holds."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


class ToolCallParser(abc.ABC):
    """Finds calls between ``CALL_START`` and ``CALL_END``, inside ``SECTION`` (start, end)
    when the family wraps its calls in one. A fresh parser per sequence.

    A call is opened as soon as its ``header`` (name, id, where the arguments start) can be
    read: from then on it is a call, whatever follows, and its arguments stream as written,
    less a tail that may still turn out to be the call's closing (``ARGS_HELD``), with
    ``final_arguments`` cutting the closing off once the call ends (or the output does). A
    body whose header never shows is read whole at its end by ``parse_call``; if that finds
    no call either, it stays in the answer as text.

    ``push`` returns OpenAI tool-call deltas: a call's first delta has its index, id, type and
    name; the next ones add to its arguments. ``calls`` holds the calls as sent so far."""

    CALL_START, CALL_END = "<tool_call>", "</tool_call>"
    SECTION: tuple[str, str] | None = None
    needs_special_tokens = False
    #: characters held back at the end of streamed arguments (they may be the call's closing)
    ARGS_HELD = " \t\r\n"

    def __init__(self) -> None:
        # "content": looking for the first call (or section); "section": between calls;
        # "call": inside a call, looking for its end
        self._state = "content"
        self._scan = self._scanner()
        self._body = ""  # the open call's text so far
        self.calls: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the call whose arguments are streaming
        self._args_at = 0  # where its arguments start in ``_body``
        # Once a call (or the section) has begun, text is held: ``_extra`` is the text outside
        # calls (content, kept if anything but whitespace); ``_raw`` is everything as written,
        # returned as plain content if no call comes of it.
        self._extra = ""
        self._raw = ""

    def header(self, body: str) -> tuple[str, str | None, int] | None:
        """``(name, call id or None, where the arguments start)`` once the open call's text
        so far shows them; None before that, or where the family's calls are read whole."""
        return None

    def final_arguments(self, raw: str) -> str:
        """A finished call's arguments, from the text after its header."""
        return raw.strip()

    @abc.abstractmethod
    def parse_call(self, body: str) -> dict[str, Any] | None:
        """One call's body (between the call tags) as an OpenAI tool call, or None."""

    @property
    def _holding(self) -> bool:
        return bool(self.calls) or self._state != "content"

    def _scanner(self) -> TagScanner:
        if self._state == "call":
            return TagScanner(self.CALL_END)
        if self.SECTION is None:
            return TagScanner(self.CALL_START)
        if self._state == "section":
            return TagScanner(self.CALL_START, self.SECTION[1])
        return TagScanner(self.SECTION[0])

    def _try_open(self) -> list[dict[str, Any]]:
        """Open the call once its header shows: its first delta."""
        found = self.header(self._body)
        if found is None:
            return []
        name, call_id, self._args_at = found
        self._open = tool_call(name, "", call_id)
        self.calls.append(self._open)
        return [{"index": len(self.calls) - 1, **self._open, "function": {"name": name,
                                                                           "arguments": ""}}]  # fmt: skip

    def _release(self, final: bool) -> list[dict[str, Any]]:
        """The open call's arguments not sent yet (all of them once it has ended)."""
        assert self._open is not None
        raw = self._body[self._args_at :]
        text = self.final_arguments(raw) if final else raw.lstrip().rstrip(self.ARGS_HELD)
        sent = self._open["function"]["arguments"]
        if len(text) <= len(sent) or not text.startswith(sent):
            return []
        self._open["function"]["arguments"] = text
        return [{"index": len(self.calls) - 1, "function": {"arguments": text[len(sent) :]}}]

    def push(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """Add content text; return (content to release, tool-call deltas)."""
        content, deltas = "", []
        while text:
            holding = self._holding
            before, found = self._scan.push(text)
            if self._state == "call":
                self._body += before
                if self._open is None:
                    deltas += self._try_open()
                if self._open is not None and not found:
                    deltas += self._release(final=False)
            elif holding:
                self._extra += before
            else:
                content += before
            if holding and not self.calls:
                self._raw += before
            if not found:
                return content, deltas
            tag = self._scan.found or ""
            text = self._scan.take_rest()
            if not self.calls:
                self._raw += tag
            if self._state == "call":  # the call closed
                deltas += self._close()
                self._state = "section" if self.SECTION else "content"
            elif tag == self.CALL_START:
                self._raw = self._raw if holding else tag
                self._state = "call"
            elif self._state == "section":  # the section closed
                self._state = "content"
            else:  # the section opened
                self._raw, self._state = tag, "section"
            if not self._holding:  # back to plain text without a call: release it
                content += self._raw
                self._raw = self._extra = ""
            self._scan = self._scanner()
        return content, deltas

    def _close(self) -> list[dict[str, Any]]:
        """The call's end: the rest of a streaming call, or the whole body read at once."""
        body, self._body = self._body, ""
        if self._open is not None:
            self._body = body
            deltas = self._release(final=True)
            self._open, self._body = None, ""
            return deltas
        call = self.parse_call(body)
        if call is None:  # not a call after all: it stays text
            self._extra += self.CALL_START + body + self.CALL_END
            return []
        self.calls.append(call)
        return [{"index": len(self.calls) - 1, **call}]

    def flush(self) -> tuple[str, list[dict[str, Any]]]:
        """At the end: text that was held back (or a call that never closed and never showed
        its header) as content, and the rest of a call cut short."""
        held = self._scan.flush()
        self._raw += held
        deltas: list[dict[str, Any]] = []
        if self._state == "call":
            if self._open is None:  # (held is the start of the end tag: not the call's)
                deltas += self._try_open()
            if self._open is not None:
                deltas += self._release(final=True)
            else:
                self._extra += self.CALL_START + self._body + held
        elif self._holding:
            self._extra += held
        else:
            self._raw = held
        self._state, self._body, self._open = "content", "", None
        self._scan = self._scanner()
        if not self.calls:
            out, self._raw, self._extra = self._raw, "", ""
            return out, deltas
        out, self._raw, self._extra = self._extra.strip(), "", ""
        return out, deltas

    def read(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """A whole answer as (content or None, tool calls), through this parser."""
        content, _ = self.push(text)
        tail, _ = self.flush()
        content += tail
        if self.calls:
            content = content.strip()
        return (content or None), self.calls

    @classmethod
    def parse(cls, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """A whole answer as (content or None, tool calls)."""
        return cls().read(text)


def _json_call(name: str, arguments: Any, call_id: str | None = None) -> dict[str, Any] | None:
    if not isinstance(name, str) or not name:
        return None
    return tool_call(name, _arguments_text(arguments), call_id)


# streams only an object's arguments; a model that writes them as a JSON string gets the
# string's text at the call's end (json.loads of the whole body), not the escaped literal
_HERMES_HEADER = re.compile(
    r'^\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)'
)


class HermesToolParser(ToolCallParser):
    """Hermes / Qwen2.5 / Qwen3: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``.
    Object arguments stream once ``{"name": ..., "arguments": {`` is written (in that
    order); the outer object's closing brace is held back until the call ends. Arguments
    written as a JSON string are read with the whole call at its end."""

    ARGS_HELD = " \t\r\n}"

    def header(self, body: str) -> tuple[str, str | None, int] | None:
        match = _HERMES_HEADER.match(body)
        if match is None:
            return None
        name = json.loads(match.group(1))
        return (name, None, match.end()) if name else None

    def final_arguments(self, raw: str) -> str:
        text = raw.strip()
        return text[:-1].rstrip() if text.endswith("}") else text

    def parse_call(self, body: str) -> dict[str, Any] | None:
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            return None
        if not isinstance(obj, dict):
            return None
        return _json_call(obj.get("name"), obj.get("arguments", obj.get("parameters", {})))


# DeepSeek's tags: fullwidth bars (U+FF5C) around words joined by U+2581.
_DS_CALLS = ("<\uff5ctool\u2581calls\u2581begin\uff5c>", "<\uff5ctool\u2581calls\u2581end\uff5c>")
_DS_CALL = ("<\uff5ctool\u2581call\u2581begin\uff5c>", "<\uff5ctool\u2581call\u2581end\uff5c>")
_DS_SEP = "<\uff5ctool\u2581sep\uff5c>"
_FENCED_JSON = re.compile(r"^\s*```(?:json)?\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)


def _valid_json(text: str) -> str | None:
    """``text`` if it is JSON (arguments are passed on as written), else None."""
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return None
    return text


_DS_V3_HEADER = re.compile(
    r"^\s*function" + re.escape(_DS_SEP) + r"([^\n]+)\n\s*```(?:json)?[ \t]*\n"
)
_CLOSING_FENCE = re.compile(r"\s*```\s*$")


class DeepSeekV3ToolParser(ToolCallParser):
    """DeepSeek-V3 / R1: ``function<｜tool▁sep｜>NAME`` and the arguments in a ```json fence
    (they stream once the fence opens; backticks at the end are held: the fence may close)."""

    CALL_START, CALL_END = _DS_CALL
    SECTION = _DS_CALLS
    needs_special_tokens = True
    ARGS_HELD = " \t\r\n`"

    def header(self, body: str) -> tuple[str, str | None, int] | None:
        match = _DS_V3_HEADER.match(body)
        name = match.group(1).strip() if match else ""
        return (name, None, match.end()) if match and name else None

    def final_arguments(self, raw: str) -> str:
        return _CLOSING_FENCE.sub("", raw).strip()

    def parse_call(self, body: str) -> dict[str, Any] | None:
        kind, sep, rest = body.partition(_DS_SEP)
        if not sep or kind.strip() != "function":
            return None
        name, _, fenced = rest.partition("\n")
        match = _FENCED_JSON.match(fenced)
        arguments = _valid_json(match.group(1).strip()) if match else None
        if arguments is None:
            return None
        return _json_call(name.strip(), arguments)


class DeepSeekV31ToolParser(ToolCallParser):
    """DeepSeek-V3.1 / V3.2: ``NAME<｜tool▁sep｜>ARGUMENTS`` (JSON, no fence)."""

    CALL_START, CALL_END = _DS_CALL
    SECTION = _DS_CALLS
    needs_special_tokens = True

    def header(self, body: str) -> tuple[str, str | None, int] | None:
        name, sep, arguments = body.partition(_DS_SEP)
        name = name.strip()
        return (name, None, len(body) - len(arguments)) if sep and name else None

    def parse_call(self, body: str) -> dict[str, Any] | None:
        name, sep, arguments = body.partition(_DS_SEP)
        checked = _valid_json(arguments.strip()) if sep else None
        return None if checked is None else _json_call(name.strip(), checked)


_KIMI_ID = re.compile(r"^\s*(?:functions\.)?([^\s:]+?):(\d+)\s*$")


class KimiK2ToolParser(ToolCallParser):
    """Kimi K2: ``functions.NAME:INDEX<|tool_call_argument_begin|>ARGUMENTS``. The model's own
    ``functions.NAME:INDEX`` is the call's id, which Kimi's chat template writes back with the
    tool's result."""

    CALL_START, CALL_END = "<|tool_call_begin|>", "<|tool_call_end|>"
    SECTION = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")
    ARGUMENTS = "<|tool_call_argument_begin|>"
    needs_special_tokens = True

    def header(self, body: str) -> tuple[str, str | None, int] | None:
        call_id, sep, arguments = body.partition(self.ARGUMENTS)
        match = _KIMI_ID.match(call_id) if sep else None
        if match is None:
            return None
        return match.group(1), call_id.strip(), len(body) - len(arguments)

    def parse_call(self, body: str) -> dict[str, Any] | None:
        call_id, sep, arguments = body.partition(self.ARGUMENTS)
        match = _KIMI_ID.match(call_id)
        checked = _valid_json(arguments.strip()) if sep and match else None
        if match is None or checked is None:
            return None
        return _json_call(match.group(1), checked, call_id.strip())


TOOL_CALL_PARSERS: dict[str, type[ToolCallParser]] = {
    "qwen25": HermesToolParser,
    "hermes": HermesToolParser,
    "deepseekv3": DeepSeekV3ToolParser,
    "deepseekv31": DeepSeekV31ToolParser,
    "kimi_k2": KimiK2ToolParser,
}
