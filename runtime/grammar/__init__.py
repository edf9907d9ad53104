"""Structured outputs: a request's output constrained to a JSON schema, JSON, a regex, a choice
or an EBNF grammar, by masking the tokens that cannot continue it (xgrammar).

``GrammarSpec`` is plain data and imports without torch or xgrammar (the HTTP process builds
it); ``GrammarBackend`` compiles specs in the engine.
"""

from tokenspeed.runtime.grammar.spec import KINDS, GrammarSpec

__all__ = ["KINDS", "GrammarSpec"]
