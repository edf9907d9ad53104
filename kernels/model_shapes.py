"""The shapes a model will run, read from its Hugging Face ``config.json`` (a plain dict).

Tuning and the benchmarks need only a handful of sizes, so this reads the JSON directly
rather than depending on ``transformers``. ``--model`` may name a directory, a
``config.json`` file, or one of the built-in presets (public config facts of common models).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PRESETS", "ModelShapes", "load_model_shapes"]


@dataclass(frozen=True)
class ModelShapes:
    """Per-layer sizes of one model (after any tensor parallel split: tp_size)."""

    name: str
    hidden: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    rot_dim: int
    intermediate: int
    num_experts: int = 0
    moe_intermediate: int = 0
    top_k: int = 0
    n_group: int | None = None
    topk_group: int | None = None
    scoring: str = "softmax"

    @property
    def is_moe(self) -> bool:
        """Whether the model has routed experts."""
        return self.num_experts > 0

    @classmethod
    def from_config(
        cls, config: dict[str, Any], name: str = "model", tp_size: int = 1
    ) -> ModelShapes:
        """Read the fields TokenSpeed kernels care about from a config.json dict."""
        text = config.get("text_config", config)
        hidden = int(text["hidden_size"])
        heads = int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads", heads))
        head_dim = int(text.get("head_dim") or hidden // heads)
        rot = int(head_dim * float(text.get("partial_rotary_factor", 1.0)))
        experts = int(
            text.get("num_experts")
            or text.get("n_routed_experts")
            or text.get("num_local_experts")
            or 0
        )
        scoring = str(text.get("scoring_func", "softmax"))
        return cls(
            name=name,
            hidden=hidden,
            num_q_heads=max(1, heads // tp_size),
            num_kv_heads=max(1, kv_heads // tp_size),
            head_dim=head_dim,
            rot_dim=rot,
            intermediate=int(text.get("intermediate_size", 4 * hidden)) // tp_size,
            num_experts=experts,
            moe_intermediate=int(
                text.get("moe_intermediate_size") or text.get("intermediate_size", 0)
            )
            // tp_size,
            top_k=int(text.get("num_experts_per_tok") or text.get("num_experts_per_token") or 0),
            n_group=text.get("n_group"),
            topk_group=text.get("topk_group"),
            scoring=scoring,
        )


PRESETS: dict[str, dict[str, Any]] = {
    "llama-3-8b": {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 14336},
    "qwen3-8b": {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288},
    "qwen3-30b-a3b": {
        "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "intermediate_size": 6144, "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
    },
    "deepseek-v2-lite": {
        "hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 128,
        "intermediate_size": 10944, "n_routed_experts": 64, "num_experts_per_tok": 6, "moe_intermediate_size": 1408,
    },
}  # fmt: skip


def load_model_shapes(model: str, tp_size: int = 1) -> ModelShapes:
    """Shapes from a model directory, a config.json path, or a preset name."""
    path = Path(model).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return ModelShapes.from_config(
            json.loads(path.read_text()), name=path.parent.name, tp_size=tp_size
        )
    key = model.lower().rsplit("/", 1)[-1]
    if key in PRESETS:
        return ModelShapes.from_config(PRESETS[key], name=key, tp_size=tp_size)
    raise FileNotFoundError(
        f"no config.json at {model!r} and no preset by that name (presets: {', '.join(PRESETS)})"
    )
