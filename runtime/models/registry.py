"""Model classes keyed by the ``architectures`` entry of config.json."""

from __future__ import annotations

from torch import nn

from tokenspeed.runtime.model_loader.errors import ModelLoadError
from tokenspeed.runtime.models.deepseek_v2 import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM
from tokenspeed.runtime.models.llama import LlamaForCausalLM, Qwen2ForCausalLM
from tokenspeed.runtime.models.qwen3 import Qwen3ForCausalLM, Qwen3MoeForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "DeepseekV2ForCausalLM": DeepseekV2ForCausalLM,
    "DeepseekV3ForCausalLM": DeepseekV3ForCausalLM,
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
}


def get_model_class(architecture: str) -> type[nn.Module]:
    """The class for an architecture name, or one clear error listing what is supported."""
    try:
        return MODEL_REGISTRY[architecture]
    except KeyError:
        raise ModelLoadError(
            f"unsupported architecture {architecture!r}; supported: {', '.join(sorted(MODEL_REGISTRY))}"
        ) from None
