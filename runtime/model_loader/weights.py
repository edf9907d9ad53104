"""Finding and streaming safetensors weights, one tensor at a time.

Streaming keeps peak host memory at about one tensor (never more than one shard) on top of the
model itself: each shard is memory-mapped by ``safe_open`` and tensors are materialised only
when they are copied into their parameter.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from tokenspeed.runtime.model_loader.errors import ModelLoadError

INDEX_NAME = "model.safetensors.index.json"


def find_weight_files(model_dir: Path) -> list[Path]:
    """The checkpoint's safetensors shards in load order; a missing shard is a clear error."""
    model_dir = Path(model_dir)
    index = model_dir / INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise ModelLoadError(f"{index} is not a valid safetensors index: {exc}") from exc
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (model_dir / n).is_file()]
        if missing:
            raise ModelLoadError(
                f"checkpoint {model_dir} is incomplete: shard(s) {', '.join(missing)} listed in "
                f"{INDEX_NAME} are missing"
            )
        return [model_dir / n for n in names]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(
            f"no *.safetensors weights in {model_dir} (use --load-format dummy for random weights)"
        )
    return files


def iter_safetensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` shard by shard; each tensor is read only when asked for."""
    for path in files:
        try:
            handle = safe_open(str(path), framework="pt", device="cpu")
        except Exception as exc:  # safetensors raises its own error types
            raise ModelLoadError(f"cannot read weights file {path}: {exc}") from exc
        with handle as f:
            for name in f.keys():  # noqa: SIM118 - safe_open handles have no __iter__
                yield name, f.get_tensor(name)
