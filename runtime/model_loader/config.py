"""Reading a Hugging Face ``config.json`` into the few facts the runtime needs.

We keep the raw dict (models read their own keys) and normalise the handful of fields whose
spelling changed across transformers versions (``rope_parameters`` vs ``rope_theta`` +
``rope_scaling``, ``num_experts`` vs ``num_local_experts``, ``torch_dtype`` vs ``dtype``).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenspeed.runtime.model_loader.errors import ModelLoadError


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Apply ``--hf-overrides`` recursively so a nested key (rope scaling) can be changed alone."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass
class HFConfig:
    """A checkpoint's ``config.json`` (after overrides) with typed accessors for shared fields."""

    raw: dict[str, Any]
    generation: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        """Read a raw key; a JSON ``null`` counts as missing so defaults apply."""
        value = self.raw.get(key)
        return default if value is None else value

    @property
    def architecture(self) -> str:
        archs = self.raw.get("architectures") or []
        if not archs:
            raise ModelLoadError(
                "config.json has no 'architectures' entry; cannot pick a model class"
            )
        return str(archs[0])

    @property
    def hidden_size(self) -> int:
        return int(self.raw["hidden_size"])

    @property
    def num_layers(self) -> int:
        return int(self.raw["num_hidden_layers"])

    @property
    def num_heads(self) -> int:
        return int(self.raw["num_attention_heads"])

    @property
    def num_kv_heads(self) -> int:
        return int(self.get("num_key_value_heads", self.num_heads))

    @property
    def head_dim(self) -> int:
        return int(self.get("head_dim", self.hidden_size // self.num_heads))

    @property
    def vocab_size(self) -> int:
        return int(self.raw["vocab_size"])

    @property
    def max_position_embeddings(self) -> int:
        return int(self.get("max_position_embeddings", 4096))

    @property
    def rms_norm_eps(self) -> float:
        return float(self.get("rms_norm_eps", 1e-6))

    @property
    def tie_word_embeddings(self) -> bool:
        return bool(self.get("tie_word_embeddings", False))

    @property
    def num_experts(self) -> int:
        return int(self.get("num_experts", self.get("num_local_experts", 0)))

    @property
    def torch_dtype_name(self) -> str | None:
        value = self.get("dtype", self.get("torch_dtype"))
        return None if value is None else str(value).replace("torch.", "")

    @property
    def rope_parameters(self) -> dict[str, Any]:
        """RoPE settings in transformers-5 form: ``rope_type``, ``rope_theta`` and scaling keys."""
        params = self.raw.get("rope_parameters")
        if isinstance(params, dict) and "rope_theta" in params:
            out = dict(params)
        else:
            out = dict(self.raw.get("rope_scaling") or {})
            out["rope_theta"] = float(self.get("rope_theta", 10000.0))
        if "type" in out and "rope_type" not in out:
            out["rope_type"] = out.pop("type")
        out.setdefault("rope_type", "default")
        if "partial_rotary_factor" not in out and self.get("partial_rotary_factor") is not None:
            out["partial_rotary_factor"] = float(self.raw["partial_rotary_factor"])
        return out

    def eos_token_ids(self) -> list[int]:
        """EOS ids from generation_config.json first (it is what HF ``generate`` stops on), then config."""
        for source in (self.generation, self.raw):
            value = source.get("eos_token_id")
            if value is None:
                continue
            return [int(v) for v in value] if isinstance(value, list) else [int(value)]
        return []


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc


def load_hf_config(model_dir: Path, hf_overrides: dict[str, Any] | None = None) -> HFConfig:
    """Read config.json (+ generation_config.json) from a checkpoint directory, applying overrides."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelLoadError(f"model path {model_dir} does not exist or is not a directory")
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise ModelLoadError(
            f"{model_dir} is not a model directory: it has no config.json "
            "(expected a Hugging Face checkpoint: config.json + *.safetensors)"
        )
    raw = _read_json(cfg_path)
    if hf_overrides:
        raw = deep_merge(raw, hf_overrides)
    gen_path = model_dir / "generation_config.json"
    generation = _read_json(gen_path) if gen_path.is_file() else {}
    return HFConfig(raw=raw, generation=generation)
