"""Forced tool calls: `tool_choice` "required" or a named function, by structured outputs.

A model asked to call a tool is held by a grammar to the call's JSON, so no tool-call parser is
needed (vLLM does the same): a named function's output is its arguments object (the function's
`parameters` schema); "required" outputs a JSON array of `{"name", "parameters"}` objects, one
of the tools each. The server then answers with `tool_calls` instead of `content`. "auto", where
the model decides, needs the model's own tool-call format parsed (`runtime/parsers/`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tokenspeed.runtime.grammar.spec import GrammarSpec
from tokenspeed.runtime.parsers.tool_calls import tool_call


class ToolChoiceError(ValueError):
    """A `tool_choice` / `tools` combination this server cannot honour (a 400)."""


@dataclass(frozen=True)
class ForcedTools:
    """The grammar that forces the call(s), and the function's name when one is named."""

    spec: GrammarSpec
    name: str | None = None  # None: "required", the output names its tools

    @property
    def finish_reason(self) -> str:
        """OpenAI's: "stop" for a named function, "tool_calls" for "required"."""
        return "stop" if self.name is not None else "tool_calls"


def _functions(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Tool name -> its `parameters` schema; every tool must be a named function."""
    out: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools or []):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise ToolChoiceError(f"tools[{i}] is not a function tool")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ToolChoiceError(f"tools[{i}].function needs a name")
        params = fn.get("parameters") or {"type": "object"}
        if not isinstance(params, dict):
            raise ToolChoiceError(f"tools[{i}].function.parameters must be a JSON schema object")
        out[name] = params
    return out


def forced_tools(
    tools: list[dict[str, Any]] | None, tool_choice: Any, parallel: bool = True
) -> ForcedTools | None:
    """The constraint `tool_choice` asks for, or None: no choice or "none" (the tools are only
    shown to the model by the chat template), or "auto" (the server's tool-call parser finds
    the calls, if it has one). ``parallel=False`` (OpenAI's `parallel_tool_calls`) allows one
    call. Raises `ToolChoiceError` for what cannot be done."""
    if tool_choice in (None, "none", "auto"):
        return None
    functions = _functions(tools)
    if tool_choice == "required":
        if not functions:
            raise ToolChoiceError('tool_choice "required" needs at least one tool')
        calls = [
            {
                "type": "object",
                "properties": {"name": {"const": name}, "parameters": params},
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
            for name, params in functions.items()
        ]
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        if not parallel:
            schema["maxItems"] = 1
        return ForcedTools(GrammarSpec.json_schema(schema))
    fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    if not isinstance(fn, dict) or tool_choice.get("type", "function") != "function":
        raise ToolChoiceError(
            'tool_choice must be "none", "auto", "required" or '
            '{"type": "function", "function": {"name": ...}}'
        )
    name = fn.get("name")
    if name not in functions:
        raise ToolChoiceError(f"tool_choice names {name!r}, which is not among the tools")
    return ForcedTools(GrammarSpec.json_schema(functions[name]), name)


def parse_required(text: str) -> list[dict[str, Any]] | None:
    """The tool calls of a complete "required" output, or None if it was cut short."""
    try:
        calls = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        return None
    return [
        tool_call(str(c.get("name")), json.dumps(c.get("parameters"), ensure_ascii=False))
        for c in calls
    ]


def forced_message(forced: ForcedTools, text: str, finish: str) -> tuple[dict[str, Any], str]:
    """The assistant message and finish reason for a forced call's whole output. Output cut
    short by `max_tokens` keeps its finish reason; for "required" it stays plain content."""
    if forced.name is not None:
        calls = [tool_call(forced.name, text)]
    else:
        parsed = parse_required(text) if finish == "stop" else None
        if parsed is None:
            return {"role": "assistant", "content": text}, finish
        calls = parsed
    reason = forced.finish_reason if finish == "stop" else finish
    return {"role": "assistant", "content": None, "tool_calls": calls}, reason


def message_delta(message: dict[str, Any]) -> dict[str, Any]:
    """A whole assistant message as one streamed delta (each tool call with its index)."""
    calls = message.get("tool_calls")
    if calls:
        return {"content": None, "tool_calls": [{"index": k, **c} for k, c in enumerate(calls)]}
    return {"content": message.get("content")}
