"""``tokenspeed tune-kernels``: measure kernel configs for a model's shapes on this GPU.

Registered on the main app as ``app.command("tune-kernels")(tune_kernels)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["tune_kernels"]


def _recipe_settings(recipe: str) -> dict[str, Any]:
    """Model, tensor-parallel size, page size and dtype named by a recipe (name or file)."""
    from tokenspeed.runtime.config import build_server_args
    from tokenspeed.runtime.recipes import load_recipe

    loaded = load_recipe(recipe)
    args = build_server_args(loaded.options, source=str(loaded.path))
    return {
        "model": args.model,
        "tp_size": args.attn_tp_size or args.tensor_parallel_size,
        "page_size": args.page_size,
        "dtype": args.dtype if args.dtype in ("bfloat16", "float16") else None,
    }


def _model_config_path(model: str) -> str:
    """A shipped architecture name resolves to its config directory; anything else as given."""
    from tokenspeed.runtime.model_source import is_shipped_architecture, resolve_model_path

    return str(resolve_model_path(model)) if is_shipped_architecture(model) else model


def tune_kernels(
    recipe: Annotated[
        str | None,
        typer.Option(help="Recipe name or file naming the model (and TP size, page size)."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="Model directory, config.json, or preset (e.g. qwen3-30b-a3b)."),
    ] = None,
    ops: Annotated[
        list[str] | None,
        typer.Option(
            "--ops", help="Ops to tune (e.g. attention.decode); repeatable. Default: all."
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(help="Where to write; default ~/.cache/tokenspeed/kernels/<device>.json."),
    ] = None,
    dtype: Annotated[
        str, typer.Option(help="Activation/KV dtype: bfloat16 or float16.")
    ] = "bfloat16",
    page_size: Annotated[
        int | None, typer.Option(help="KV page size (default: recipe's, else 16).")
    ] = None,
    tp_size: Annotated[
        int | None, typer.Option(help="Tensor-parallel size the heads are split over.")
    ] = None,
    max_configs: Annotated[
        int, typer.Option(help="Cap on configs tried per kernel and shape (0: all).")
    ] = 24,
    replays: Annotated[int, typer.Option(help="CUDA-graph replays per measurement (median).")] = 20,
) -> None:
    """Benchmark kernel launch configs over the model's shape buckets and save the fastest."""
    import torch
    from rich.console import Console

    console = Console()
    if not torch.cuda.is_available():
        console.print(
            "No CUDA device here: there is nothing to tune (tune-kernels measures the GPU present)."
        )
        raise typer.Exit(code=1)

    from tokenspeed.kernels.device import device_info
    from tokenspeed.kernels.model_shapes import load_model_shapes
    from tokenspeed.kernels.tuned import default_tuning_path
    from tokenspeed.kernels.tuning import TUNABLE_OPS, count_configs, tune, tuning_cases
    from tokenspeed.runtime.config import ConfigError

    try:
        settings = _recipe_settings(recipe) if recipe else {}
    except ConfigError as e:
        console.print(f"[red]{e}[/]")
        raise typer.Exit(code=2) from None
    model_name = model or settings.get("model")
    if not model_name:
        console.print("[red]Give --model or a --recipe that names one.[/]")
        raise typer.Exit(code=2)
    unknown = sorted(set(ops or ()) - set(TUNABLE_OPS))
    if unknown:
        console.print(f"[red]Unknown ops {unknown}; choose from {', '.join(TUNABLE_OPS)}[/]")
        raise typer.Exit(code=2)
    shapes = load_model_shapes(
        _model_config_path(str(model_name)), tp_size=int(tp_size or settings.get("tp_size") or 1)
    )
    pages = int(page_size or settings.get("page_size") or 16)
    torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[
        settings.get("dtype") or dtype
    ]
    cases = tuning_cases(shapes, ops or TUNABLE_OPS, page_size=pages)
    dev = device_info(torch.device("cuda"))
    target = output or default_tuning_path(dev)
    console.print(
        f"Tuning {len(cases)} shape buckets of {shapes.name} on {dev.name} ({dtype}, page size {pages})"
    )

    limit = max_configs or None
    table, results = _run_with_progress(
        console, cases, torch_dtype, limit, replays, count_configs, tune
    )
    path = table.save(target)
    _print_summary(console, results)
    console.print(
        f"Wrote {path}; `tokenspeed serve` loads it by default (or pass --kernel-config {path})."
    )


def _run_with_progress(console, cases, dtype, max_configs, replays, count_configs, tune):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]tuning"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.description}"), console=console,
    ) as progress:  # fmt: skip
        task = progress.add_task("", total=count_configs(cases, max_configs))

        def step(label: str) -> None:
            progress.update(task, advance=1, description=label[:60])

        return tune(cases, dtype=dtype, max_configs=max_configs, replays=replays, on_step=step)


def _print_summary(console, results) -> None:
    from rich.table import Table

    summary = Table(title="Tuned kernels (median per call)")
    for col in ("op", "shape", "default", "default µs", "tuned", "tuned µs", "speed-up"):
        summary.add_column(col, overflow="fold")
    for r in results:
        shape = ",".join(
            f"{k}={v}"
            for k, v in r.case.shape.items()
            if k in ("tokens", "batch", "kv_len", "q_len", "prefix_len")
        )
        cfg = ",".join(f"{k}={v}" for k, v in r.best_config.items())
        summary.add_row(
            r.case.op, shape, r.default_kernel, f"{r.default_us:.1f}",
            f"{r.best_kernel} {cfg}", f"{r.best_us:.1f}", f"{r.speedup:.2f}x",
        )  # fmt: skip
    console.print(summary)
