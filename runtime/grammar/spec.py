"""What a request's output must match: a JSON schema, any JSON, a regex, a choice or a grammar.

The spec is plain data (two strings), so it crosses the HTTP-to-engine wire in msgpack as it
is and needs neither torch nor xgrammar to build; the engine compiles it (``backend``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

#: The kinds of constraint, as the OpenAI (``response_format``) and vLLM
#: (``structured_outputs``) request fields name them.
KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
_WIRE_KEYS = {"kind", "value", "any_whitespace"}


@dataclass(frozen=True)
class GrammarSpec:
    """One output constraint: ``kind`` (see ``KINDS``) and its text.

    ``json_schema``: the schema as JSON text; ``json_object``: any JSON object (no text);
    ``regex``: the pattern; ``choice``: a JSON list of the allowed strings; ``grammar``: an
    EBNF grammar in xgrammar's (GBNF-like) notation with a ``root`` rule. ``any_whitespace``
    (JSON kinds) allows any whitespace between JSON tokens, as vLLM does by default; off, the
    JSON is laid out with single spaces (``{"a": 1, "b": 2}``), which keeps small or unsure
    models from emitting whitespace until ``max_tokens``.
    """

    kind: str
    value: str = ""
    any_whitespace: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown grammar kind {self.kind!r}; expected one of {KINDS}")

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str, any_whitespace: bool = True) -> GrammarSpec:
        """A JSON value matching ``schema`` (a dict or its JSON text)."""
        text = schema if isinstance(schema, str) else json.dumps(schema)
        return cls("json_schema", text, any_whitespace)

    @classmethod
    def json_object(cls, any_whitespace: bool = True) -> GrammarSpec:
        """Any JSON object (OpenAI's JSON mode)."""
        return cls("json_object", "", any_whitespace)

    @classmethod
    def regex(cls, pattern: str) -> GrammarSpec:
        return cls("regex", pattern)

    @classmethod
    def choice(cls, options: list[str]) -> GrammarSpec:
        """Exactly one of ``options``."""
        if not options or not all(isinstance(o, str) for o in options):
            raise ValueError("choice needs a non-empty list of strings")
        return cls("choice", json.dumps(list(options)))

    @classmethod
    def grammar(cls, ebnf: str) -> GrammarSpec:
        return cls("grammar", ebnf)

    @classmethod
    def coerce(cls, value: GrammarSpec | dict[str, Any] | None) -> GrammarSpec | None:
        """A spec from itself or its wire form (``to_dict``)."""
        if value is None or isinstance(value, GrammarSpec):
            return value
        if isinstance(value, dict) and set(value) <= _WIRE_KEYS and "kind" in value:
            return cls(
                str(value["kind"]),
                str(value.get("value", "")),
                bool(value.get("any_whitespace", True)),
            )
        raise ValueError(f"a grammar is a GrammarSpec or a dict of {sorted(_WIRE_KEYS)}")

    def to_dict(self) -> dict[str, Any]:
        """The wire form (msgpack, JSON)."""
        return {"kind": self.kind, "value": self.value, "any_whitespace": self.any_whitespace}

    def choices(self) -> list[str]:
        """The options of a ``choice`` spec."""
        return list(json.loads(self.value))
