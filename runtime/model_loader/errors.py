"""The one exception type a bad checkpoint produces."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """Raised for every checkpoint problem, so the CLI can print one clear line instead of a trace."""
