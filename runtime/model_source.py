"""Where a model comes from: the embedded tiny model, a shipped public architecture, or a path.

`--model` accepts three things, resolved in this order:
1. nothing: the embedded tiny model (written to the cache folder on first use);
2. the name of a shipped public architecture (`qwen3-8b`, `deepseek-v3`, ...): a directory
   holding only its published config.json, usable with `--load-format dummy`;
3. a local Hugging Face directory.
"""

from __future__ import annotations

from pathlib import Path

from tokenspeed.runtime.config import ConfigError

_CONFIGS_DIR = Path(__file__).with_name("model_configs")


def shipped_architectures() -> list[str]:
    """Names of the public architectures whose config.json ships with TokenSpeed."""
    return sorted(p.parent.name for p in _CONFIGS_DIR.glob("*/config.json"))


def is_shipped_architecture(model: str | None) -> bool:
    return model is not None and (_CONFIGS_DIR / model / "config.json").is_file()


def resolve_model_path(model: str | None, load_format: str = "dummy") -> Path:
    """The directory holding the model's config.json (see the module docstring).

    A shipped architecture has no weights, so it needs `load_format="dummy"`; the default
    here suits callers that only read the config.
    """
    if model is None:
        from tokenspeed.runtime.tiny_model import ensure_tiny_model

        return ensure_tiny_model()
    if is_shipped_architecture(model) and not Path(model).exists():
        if load_format != "dummy":
            raise ConfigError(
                f"{model!r} is a shipped architecture without weights: pass a checkpoint "
                f"directory as MODEL, or add --load-format dummy for random weights",
                key="model",
            )
        return _CONFIGS_DIR / model
    path = Path(model).expanduser()
    if not path.exists():
        raise ConfigError(
            f"{model!r} is neither a local directory nor a shipped architecture "
            f"({', '.join(shipped_architectures())}); TokenSpeed does not download models",
            key="model",
        )
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ConfigError(
            f"{model!r} is not a Hugging Face model directory (no config.json)", key="model"
        )
    return path
