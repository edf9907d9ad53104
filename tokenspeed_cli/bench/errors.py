"""The one exception type the benchmark raises for user-facing problems."""

from __future__ import annotations


class BenchError(Exception):
    """A problem the user can fix (bad flag, bad file, unreachable server).

    The command turns it into one clear error line and a non-zero exit, never a traceback.
    """
