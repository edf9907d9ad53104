"""The import rules that keep the planes apart (ARCHITECTURE.md), checked on the source."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, absolute or relative (relative ones resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ["tokenspeed", *path.relative_to(ROOT).parent.parts]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                found.add(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                found.add(node.module)
    return found


def python_files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def violations(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for path in python_files(folder):
        for module in imported_modules(path):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(ROOT)} imports {module}")
    return bad


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        (
            "scheduler",
            (
                "torch",
                "triton",
                "tokenspeed.runtime",
                "tokenspeed.kernels",
                "tokenspeed.mla",
                "tokenspeed_cli",
            ),
        ),
        ("kernels", ("tokenspeed.runtime", "tokenspeed_cli")),
        ("mla", ("tokenspeed.runtime", "tokenspeed_cli")),
        ("runtime", ("tokenspeed_cli",)),
        ("runtime/models", ("triton",)),
        ("runtime/layers", ("triton",)),
    ],
)
def test_import_rules(folder, forbidden):
    assert violations(folder, forbidden) == []


def test_engine_never_imports_the_http_server():
    engine_dirs = [
        d for d in ("runtime/engine", "runtime/model_executor.py") if (ROOT / d).exists()
    ]
    bad = []
    for d in engine_dirs:
        paths = [ROOT / d] if d.endswith(".py") else python_files(d)
        for path in paths:
            bad += [
                f"{path.name} imports {m}"
                for m in imported_modules(path)
                if m.startswith("tokenspeed.runtime.entrypoints") or m in ("fastapi", "uvicorn")
            ]
    assert bad == []
