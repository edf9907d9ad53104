"""Deployment recipes: `ServerArgs` as TOML files, one table per option group.

A recipe is config-as-code for one model on one kind of machine:

    description = "Qwen3-8B on one H200"
    [model]
    model = "Qwen/Qwen3-8B"
    [scheduler]
    chunked_prefill_size = 8192

Every key must be a known option in its own group's table; errors name the file, the key and
the reason. `save_recipe` writes the same format back, so a resolved configuration round-trips.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from tokenspeed.runtime.config import (
    GROUPS,
    ConfigError,
    ServerArgs,
    coerce_values,
    option_fields,
    spec_of,
)

RECIPE_SUFFIX = ".toml"


def recipes_dir() -> Path:
    """Where the shipped recipes live (the repository's `recipes/`, or the wheel's copy)."""
    package_root = Path(__file__).resolve().parent.parent
    for candidate in (package_root / "recipes", package_root.parent / "recipes"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"no shipped recipes found next to {package_root}")


@dataclass(frozen=True)
class Recipe:
    """A parsed, type-checked recipe: its options and where it came from."""

    path: Path
    description: str
    options: dict[str, Any]

    @property
    def name(self) -> str:
        return self.path.stem


def shipped_recipes() -> list[Recipe]:
    """The recipes that ship with TokenSpeed, sorted by name."""
    return [load_recipe(p) for p in sorted(recipes_dir().glob(f"*{RECIPE_SUFFIX}"))]


def find_recipe(name_or_path: str | Path) -> Path:
    """A recipe file from a path, or from the name of a shipped recipe (`tiny`)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    if path.suffix != RECIPE_SUFFIX and path.parent == Path("."):
        shipped = recipes_dir() / f"{path.name}{RECIPE_SUFFIX}"
        if shipped.is_file():
            return shipped
        names = ", ".join(p.stem for p in sorted(recipes_dir().glob(f"*{RECIPE_SUFFIX}")))
        raise ConfigError(
            f"no such recipe file or shipped recipe (shipped: {names})", source=str(name_or_path)
        )
    raise ConfigError("no such recipe file", source=str(name_or_path))


def load_recipe(name_or_path: str | Path) -> Recipe:
    """Parse and type-check a recipe; raises `ConfigError` naming file, key and reason."""
    path = find_recipe(name_or_path)
    source = str(path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"not valid TOML ({e})", source=source) from None
    except OSError as e:
        raise ConfigError(f"cannot read ({e.strerror})", source=source) from None

    description = data.pop("description", "")
    if not isinstance(description, str):
        raise ConfigError("expected a string", key="description", source=source)
    group_of = {f.name: spec_of(f).group for f in option_fields()}
    values: dict[str, Any] = {}
    key_names: dict[str, str] = {}
    for group, table in data.items():
        if group not in GROUPS:
            if group in group_of:
                raise ConfigError(
                    f"options belong in their group's table: put it under [{group_of[group]}]",
                    key=group,
                    source=source,
                )
            raise ConfigError(
                f"unknown table (known: description, {', '.join(f'[{g}]' for g in GROUPS)})",
                key=group,
                source=source,
            )
        if not isinstance(table, dict):
            raise ConfigError("expected a table", key=group, source=source)
        for key, value in table.items():
            spelled = f"[{group}] {key}"
            if key not in group_of:
                raise ConfigError(
                    f"unknown option in [{group}] (known there: "
                    f"{', '.join(n for n, g in group_of.items() if g == group)})",
                    key=spelled,
                    source=source,
                )
            if group_of[key] != group:
                raise ConfigError(
                    f"belongs in [{group_of[key]}], not [{group}]", key=spelled, source=source
                )
            values[key] = value
            key_names[key] = spelled
    options = coerce_values(values, source=source, key_names=key_names)
    return Recipe(path=path, description=description, options=options)


def recipe_toml(args: ServerArgs, *, description: str = "", only_changed: bool = False) -> str:
    """TOML text for `args`, grouped by table (None values are left out: TOML has no null)."""
    defaults = ServerArgs()
    doc: dict[str, Any] = {}
    if description:
        doc["description"] = description
    for f in option_fields():
        value = getattr(args, f.name)
        if value is None or (only_changed and value == getattr(defaults, f.name)):
            continue
        doc.setdefault(spec_of(f).group, {})[f.name] = value
    return tomli_w.dumps(doc)


def save_recipe(args: ServerArgs, path: str | Path, *, description: str = "") -> Path:
    """Write the resolved configuration as a recipe that `--recipe` reads back unchanged."""
    path = Path(path)
    header = "# Written by `tokenspeed serve --save-recipe`: the fully resolved configuration.\n"
    path.write_text(header + recipe_toml(args, description=description))
    return path
