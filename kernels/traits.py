"""Shape-trait rules and bucketing.

A kernel declares which values of a shape trait (head_dim, page_size, num_tokens, ...) it
supports with a rule; a rule is a predicate that also prints itself, so
``explain_selection`` can say exactly why a kernel was dropped. Traits that vary per step
(token counts, batch sizes, context lengths) are rounded up to a power of two before they
reach the selector, so the selection cache and the tuning file see a small set of buckets.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

__all__ = [
    "TraitRule",
    "as_rule",
    "at_least",
    "at_most",
    "between",
    "bucket",
    "divides",
    "multiple_of",
    "one_of",
]


@dataclass(frozen=True)
class TraitRule:
    """A named predicate over one trait value."""

    text: str
    check: Callable[[Any], bool]

    def __call__(self, value: Any) -> bool:
        return bool(self.check(value))

    def __str__(self) -> str:
        return self.text


def one_of(*values: Any) -> TraitRule:
    """The value is one of ``values``."""
    allowed = frozenset(values)
    return TraitRule(
        f"in {{{', '.join(map(repr, sorted(allowed, key=repr)))}}}", allowed.__contains__
    )


def at_least(low: int) -> TraitRule:
    """The value is >= ``low``."""
    return TraitRule(f">= {low}", lambda v: v >= low)


def at_most(high: int) -> TraitRule:
    """The value is <= ``high``."""
    return TraitRule(f"<= {high}", lambda v: v <= high)


def between(low: int, high: int) -> TraitRule:
    """``low <= value <= high``."""
    return TraitRule(f"in [{low}, {high}]", lambda v: low <= v <= high)


def multiple_of(n: int) -> TraitRule:
    """The value is a multiple of ``n``."""
    return TraitRule(f"a multiple of {n}", lambda v: v % n == 0)


def divides(n: int) -> TraitRule:
    """The value divides ``n``."""
    return TraitRule(f"a divisor of {n}", lambda v: v > 0 and n % v == 0)


def as_rule(rule: Any) -> TraitRule:
    """Accept a TraitRule, a collection of allowed values, or a bare predicate."""
    if isinstance(rule, TraitRule):
        return rule
    if isinstance(rule, Collection) and not isinstance(rule, str):
        return one_of(*rule)
    if callable(rule):
        name = getattr(rule, "__name__", "predicate")
        return TraitRule(f"accepted by {name}", rule)
    return one_of(rule)


def bucket(n: int) -> int:
    """Round a per-step size up to the next power of two (0 stays 0)."""
    n = int(n)
    return 0 if n <= 0 else 1 << (n - 1).bit_length()
