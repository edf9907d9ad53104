"""Command-line flags generated from `ServerArgs`, so an option is declared in one place.

`server_args_command` wraps a callback so Typer sees one keyword parameter per option (flag
names follow the field names: `max_num_seqs` -> `--max-num-seqs`; booleans get `--no-...`),
each defaulting to None so that only the flags a user typed override the recipe.
"""

from __future__ import annotations

import enum
import functools
import inspect
from collections.abc import Callable
from typing import Any

import typer

from tokenspeed.runtime.config import (
    GROUPS,
    ServerArgs,
    base_type,
    field_types,
    option_fields,
    spec_of,
)


def flag_name(name: str) -> str:
    """`max_num_seqs` -> `--max-num-seqs`."""
    return "--" + name.replace("_", "-")


def _choice_enum(name: str, choices: tuple[str, ...]) -> type[enum.Enum]:
    return enum.Enum(name, [(c, c) for c in choices], type=str)  # type: ignore[return-value]


def _flag_parameters() -> list[inspect.Parameter]:
    defaults = ServerArgs()
    params = []
    for f in option_fields():
        spec = spec_of(f)
        kind = base_type(field_types()[f.name])
        default = getattr(defaults, f.name)
        annotation: Any
        decls = [flag_name(f.name)]
        if kind is bool:
            annotation = bool | None
            decls = [f"{flag_name(f.name)}/--no-{f.name.replace('_', '-')}"]
        elif spec.choices is not None:
            annotation = _choice_enum(f"{f.name}_choice", spec.choices) | None
        elif kind is dict or spec.parse is not None:
            annotation = str | None  # parsed by ServerArgs (JSON objects, sizes)
        else:
            annotation = kind | None
        shown = (
            "none"
            if default is None or default == {}
            else str(default).lower()
            if isinstance(default, bool)
            else str(default)
        )
        option = typer.Option(
            None,
            *decls,
            help=spec.help,
            show_default=shown,
            metavar=spec.metavar,
            rich_help_panel=GROUPS[spec.group],
        )
        params.append(
            inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation
            )
        )
    return params


def server_args_command(func: Callable[..., Any]) -> Callable[..., Any]:
    """Give `func` one flag per `ServerArgs` option; it receives them as `overrides: dict`.

    `func` keeps its own parameters (shown first) and must accept `overrides`.
    """
    own = [
        p
        for name, p in inspect.signature(func, eval_str=True).parameters.items()
        if name != "overrides"
    ]
    names = [f.name for f in option_fields()]

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        overrides = {}
        for name in names:
            value = kwargs.pop(name)
            if value is not None:
                overrides[name] = value.value if isinstance(value, enum.Enum) else value
        return func(**kwargs, overrides=overrides)

    params = own + _flag_parameters()
    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    del wrapper.__wrapped__  # inspect must see the generated signature, not func's
    return wrapper
