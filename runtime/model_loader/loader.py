"""Building a model from a checkpoint directory (or with dummy weights)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tokenspeed.runtime.model_loader.config import HFConfig, load_hf_config
from tokenspeed.runtime.model_loader.errors import ModelLoadError
from tokenspeed.runtime.model_loader.weights import find_weight_files, iter_safetensors

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
}


def resolve_dtype(requested: str | torch.dtype, cfg: HFConfig, device: torch.device) -> torch.dtype:
    """``--dtype``: ``auto`` keeps the checkpoint's dtype (float32 if it names none).

    On CPU, float16 becomes float32 under ``auto`` because CPU half GEMMs are slow and lossy;
    an explicit ``float16`` is honoured.
    """
    if isinstance(requested, torch.dtype):
        return requested
    if requested != "auto":
        if requested not in _DTYPES:
            raise ValueError(f"unknown dtype {requested!r}; use auto, bfloat16, float16 or float32")
        return _DTYPES[requested]
    dtype = _DTYPES.get(cfg.torch_dtype_name or "float32", torch.float32)
    if device.type == "cpu" and dtype == torch.float16:
        return torch.float32
    return dtype


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def init_dummy_weights(model: nn.Module, seed: int) -> None:
    """Random weights for ``--load-format dummy``: small normal matrices, unit norm scales.

    Norm weights of one keep activations in range so a dummy model behaves like a real one
    for throughput work. Values are drawn on the parameter's device (fast for 8B-size models)
    from a seeded generator, so runs on one device type repeat exactly.
    """
    generators: dict[torch.device, torch.Generator] = {}
    seen: set[int] = set()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if id(param) in seen:
                continue
            seen.add(id(param))
            if param.dim() == 1:
                param.fill_(1.0 if "norm" in name else 0.0)
                continue
            gen = generators.get(param.device)
            if gen is None:
                gen = generators[param.device] = torch.Generator(param.device).manual_seed(seed)
            param.normal_(0.0, 0.02, generator=gen)


def load_model(
    model_path: str | Path,
    *,
    dtype: str | torch.dtype = "auto",
    device: torch.device | str = "cpu",
    load_format: str = "auto",
    hf_overrides: dict[str, Any] | None = None,
    max_model_len: int | None = None,
    seed: int = 0,
) -> tuple[nn.Module, HFConfig, torch.dtype]:
    """Read config, build the registered architecture on ``device``, load or randomise weights."""
    from tokenspeed.runtime.models.registry import get_model_class

    device = torch.device(device)
    model_dir = Path(model_path)
    cfg = load_hf_config(model_dir, hf_overrides)
    cls = get_model_class(cfg.architecture)
    if load_format not in ("auto", "safetensors", "dummy"):
        raise ValueError(f"unknown load format {load_format!r}; use auto, safetensors or dummy")
    files = [] if load_format == "dummy" else find_weight_files(model_dir)
    torch_dtype = resolve_dtype(dtype, cfg, device)
    max_positions = max(cfg.max_position_embeddings, max_model_len or 0)
    try:
        with _default_dtype(torch_dtype), torch.device(device):
            model = cls(cfg, max_positions)
    except KeyError as exc:
        raise ModelLoadError(f"config.json lacks {exc} needed by {cfg.architecture}") from exc
    if load_format == "dummy":
        init_dummy_weights(model, seed)
    else:
        model.load_weights(iter_safetensors(files))  # type: ignore[operator]
    # Derived weights (MLA's absorbed W_UK / W_UV) are built once the real ones are final.
    post_load = getattr(model, "process_weights_after_loading", None)
    if post_load is not None:
        with torch.no_grad():
            post_load()
    model.eval()
    return model, cfg, torch_dtype
