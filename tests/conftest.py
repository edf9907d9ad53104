"""Test-wide settings: a private model cache so tests never touch the user's ~/.cache; a
loader for the benchmark and tool scripts, which are files, not packages."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

os.environ.setdefault("TOKENSPEED_CACHE_DIR", str(REPO_ROOT / "build" / "test-cache"))


@pytest.fixture(scope="module")
def load_script():
    """Import a script by path for one test module: registered in ``sys.modules`` until the
    module's tests end (dataclasses look their module up while it executes), with its folder
    on ``sys.path`` too when ``siblings`` (a script importing its neighbours)."""
    names: list[str] = []
    folders: list[str] = []

    def load(path: Path, *, siblings: bool = False):
        if siblings:
            folders.append(str(path.parent))
            sys.path.insert(0, folders[-1])
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        names.append(spec.name)
        spec.loader.exec_module(module)
        return module

    yield load
    for name in names:
        sys.modules.pop(name, None)
    for folder in folders:
        sys.path.remove(folder)
