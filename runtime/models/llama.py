"""Llama (2/3.x) and Qwen2: the plain Llama-family stack."""

from __future__ import annotations

from tokenspeed.runtime.model_loader.config import HFConfig
from tokenspeed.runtime.models.decoder import DecoderForCausalLM, DecoderSpec


class LlamaForCausalLM(DecoderForCausalLM):
    """Llama; ``attention_bias`` / ``mlp_bias`` come from the config."""

    def __init__(self, cfg: HFConfig, max_positions: int) -> None:
        bias = bool(cfg.get("attention_bias", False))
        self.spec = DecoderSpec(
            qkv_bias=bias, o_bias=bias, mlp_bias=bool(cfg.get("mlp_bias", False))
        )
        super().__init__(cfg, max_positions)


class Qwen2ForCausalLM(DecoderForCausalLM):
    """Qwen2 / Qwen2.5: bias on q/k/v only."""

    spec = DecoderSpec(qkv_bias=True)
