"""Fixtures for the KV-event tool tests (helpers live in kv_driver.py)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

try:
    from tokenspeed.scheduler import Scheduler  # noqa: F401  (the compiled extension)
except ImportError:  # not built: these tests drive the real scheduler, so skip them all
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture
def rng() -> random.Random:
    """A seeded random generator."""
    return random.Random(1234)
