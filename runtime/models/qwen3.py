"""Qwen3 dense and Qwen3-MoE: per-head q/k RMSNorm; MoE layers in the MoE variant."""

from __future__ import annotations

from tokenspeed.runtime.model_loader.config import HFConfig
from tokenspeed.runtime.models.decoder import DecoderForCausalLM, DecoderSpec


class Qwen3ForCausalLM(DecoderForCausalLM):
    """Qwen3 dense."""

    def __init__(self, cfg: HFConfig, max_positions: int) -> None:
        self.spec = DecoderSpec(qkv_bias=bool(cfg.get("attention_bias", False)), qk_norm=True)
        super().__init__(cfg, max_positions)


class Qwen3MoeForCausalLM(DecoderForCausalLM):
    """Qwen3-MoE: routed experts (no shared expert), softmax routing, optional top-k renorm."""

    def __init__(self, cfg: HFConfig, max_positions: int) -> None:
        self.spec = DecoderSpec(
            qkv_bias=bool(cfg.get("attention_bias", False)), qk_norm=True, moe=True
        )
        super().__init__(cfg, max_positions)
