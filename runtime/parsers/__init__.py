"""Parsers of chat output: reasoning (`--reasoning-parser`) and tool calls
(`--tool-call-parser`), run in the HTTP process on the detokenised text."""

from tokenspeed.runtime.parsers.reasoning import REASONING_PARSERS
from tokenspeed.runtime.parsers.tool_calls import TOOL_CALL_PARSERS

__all__ = ["REASONING_PARSERS", "TOOL_CALL_PARSERS"]
