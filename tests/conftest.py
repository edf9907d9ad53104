"""Test-wide settings: a private model cache so tests never touch the user's ~/.cache."""

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

os.environ.setdefault("TOKENSPEED_CACHE_DIR", str(REPO_ROOT / "build" / "test-cache"))
