"""Shared decoder-only building blocks for the Llama family (Llama, Qwen2, Qwen3, Qwen3-MoE).

The architectures differ in a few switches — q/k/v bias, per-head q/k RMSNorm, MLP bias,
MoE layers — so one parameterised stack serves them all and each model file only says which
switches it sets and how checkpoint names map onto parameters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from tokenspeed.runtime.forward_batch import ForwardBatch
from tokenspeed.runtime.layers.activation import SiluAndMul
from tokenspeed.runtime.layers.attention import Attention
from tokenspeed.runtime.layers.embedding import LMHead, VocabEmbedding
from tokenspeed.runtime.layers.linear import Linear, MergedLinear, default_weight_loader
from tokenspeed.runtime.layers.moe import FusedMoE
from tokenspeed.runtime.layers.norm import RMSNorm
from tokenspeed.runtime.layers.rotary import RotaryEmbedding
from tokenspeed.runtime.model_loader.config import HFConfig
from tokenspeed.runtime.model_loader.errors import ModelLoadError


@dataclass(frozen=True)
class DecoderSpec:
    """The switches that distinguish one Llama-family architecture from another."""

    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    moe: bool = False


class DecoderAttention(nn.Module):
    """QKV projection, optional per-head q/k norm, RoPE, paged attention, output projection."""

    def __init__(self, cfg: HFConfig, spec: DecoderSpec, layer_id: int, max_positions: int) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = MergedLinear(
            cfg.hidden_size, [q_size, kv_size, kv_size], ["q", "k", "v"], bias=spec.qkv_bias
        )
        self.o_proj = Linear(q_size, cfg.hidden_size, bias=spec.o_bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if spec.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if spec.qk_norm else None
        self.rotary = RotaryEmbedding(
            self.head_dim, cfg.rope_parameters, max_positions, cfg.max_position_embeddings
        )
        self.attn = Attention(
            self.num_heads, self.num_kv_heads, self.head_dim, layer_id, self.head_dim**-0.5
        )

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        t = hidden.shape[0]
        q, k, v = self.qkv_proj.forward_split(hidden)
        q = q.reshape(t, self.num_heads, self.head_dim)
        k = k.reshape(t, self.num_kv_heads, self.head_dim)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm.forward_heads(q), self.k_norm.forward_heads(k)
        q, k = self.rotary(positions, q.contiguous(), k.contiguous())
        return self.o_proj(self.attn(q, k, v.contiguous(), batch))


class DenseMLP(nn.Module):
    """SwiGLU MLP with gate and up stacked into one GEMM."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool) -> None:
        super().__init__()
        self.gate_up_proj = MergedLinear(
            hidden_size, [intermediate_size, intermediate_size], ["gate", "up"], bias=bias
        )
        self.act = SiluAndMul()
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


def _is_moe_layer(cfg: HFConfig, layer_id: int) -> bool:
    if cfg.num_experts <= 0:
        return False
    if layer_id in (cfg.get("mlp_only_layers", []) or []):
        return False
    return (layer_id + 1) % int(cfg.get("decoder_sparse_step", 1)) == 0


class PreNormBlock(nn.Module):
    """Pre-norm transformer block; the residual add is fused into the next norm.

    Subclasses build `input_layernorm`, `self_attn`, `post_attention_layernorm` and `mlp`;
    every architecture shares this forward.
    """

    input_layernorm: nn.Module
    self_attn: nn.Module
    post_attention_layernorm: nn.Module
    mlp: nn.Module

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, batch)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class DecoderLayer(PreNormBlock):
    """GQA attention + dense or MoE MLP (Llama, Qwen2, Qwen3, Qwen3-MoE)."""

    def __init__(self, cfg: HFConfig, spec: DecoderSpec, layer_id: int, max_positions: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DecoderAttention(cfg, spec, layer_id, max_positions)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if spec.moe and _is_moe_layer(cfg, layer_id):
            self.mlp = FusedMoE(
                num_experts=cfg.num_experts,
                top_k=int(cfg.raw["num_experts_per_tok"]),
                hidden_size=cfg.hidden_size,
                intermediate_size=int(cfg.raw["moe_intermediate_size"]),
                renormalize=bool(cfg.get("norm_topk_prob", False)),
            )
        else:
            self.mlp = DenseMLP(cfg.hidden_size, int(cfg.raw["intermediate_size"]), spec.mlp_bias)


class ModelBody(nn.Module):
    """Embedding, a stack of pre-norm blocks, final norm: the forward every model shares.

    Subclasses build `embed_tokens`, `layers` and `norm`.
    """

    embed_tokens: nn.Module
    layers: nn.ModuleList
    norm: nn.Module

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        residual: torch.Tensor | None = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, batch)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class CausalLM(nn.Module):
    """A model body plus its LM head: hidden states for every token, logits for sampled rows.

    Subclasses set `config` and `model`, call `_init_lm_head`, and define `_route(name)`,
    which maps a checkpoint tensor name to ``(parameter name or None to skip, shard id)``.
    """

    config: HFConfig
    model: ModelBody

    def _init_lm_head(self, cfg: HFConfig) -> None:
        self.lm_head = LMHead(cfg.vocab_size, cfg.hidden_size)
        if cfg.tie_word_embeddings:
            self.lm_head.tie_to(self.model.embed_tokens)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        """Hidden states ``[T, hidden]`` of every token of the step."""
        return self.model(input_ids, positions, batch)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits for the rows given (the sampled positions only)."""
        return self.lm_head(hidden)

    def _after_loading(self, loaded: dict[str, set[str]]) -> None:
        """Hook between copying tensors and checking coverage (e.g. drop unused layers)."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors into parameters; every parameter must be covered."""
        params = dict(self.named_parameters(remove_duplicate=False))
        tied = self.config.tie_word_embeddings
        loaded: dict[str, set[str]] = {}
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name or (tied and name == "lm_head.weight"):
                continue
            target, shard = self._route(name)
            if target is None:
                continue
            param = params.get(target)
            if param is None:
                raise ModelLoadError(f"checkpoint tensor {name!r} has no matching model parameter")
            loader = getattr(param, "weight_loader", None)
            try:
                if shard is None or loader is None:
                    default_weight_loader(param, tensor)
                else:
                    loader(param, tensor, shard)
            except ModelLoadError as exc:
                raise ModelLoadError(f"{name}: {exc}") from exc
            loaded.setdefault(target, set()).add(shard or "")
        self._after_loading(loaded)
        missing = [
            n
            for n, p in self.named_parameters(remove_duplicate=False)
            if not _fully_loaded(p, loaded.get(n)) and not (tied and n == "lm_head.weight")
        ]
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise ModelLoadError(f"checkpoint lacks {len(missing)} weight(s): {shown}")


class DecoderModel(ModelBody):
    """Embedding, GQA decoder layers, final norm."""

    def __init__(self, cfg: HFConfig, spec: DecoderSpec, max_positions: int) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, spec, i, max_positions) for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


# checkpoint sub-name -> (our parameter sub-name, shard id)
_STACKED = [
    (".q_proj.", ".qkv_proj.", "q"),
    (".k_proj.", ".qkv_proj.", "k"),
    (".v_proj.", ".qkv_proj.", "v"),
    (".gate_proj.", ".gate_up_proj.", "gate"),
    (".up_proj.", ".gate_up_proj.", "up"),
]
# Per-expert and fused-expert checkpoint tensor names (shared by every MoE architecture).
EXPERT_WEIGHT = re.compile(r"^(.*\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
FUSED_EXPERT_WEIGHT = re.compile(r"^(.*\.mlp)\.experts\.(gate_up_proj|down_proj)$")


def _fully_loaded(param: nn.Parameter, shards: set[str] | None) -> bool:
    """A stacked parameter counts as loaded only when every shard (or the fused form) arrived."""
    if not shards:
        return False
    expected = getattr(param, "expected_shards", None)
    return expected is None or "fused" in shards or expected <= shards


class DecoderForCausalLM(CausalLM):
    """A Llama-family causal LM; subclasses pick the ``DecoderSpec``."""

    spec = DecoderSpec()

    def __init__(self, cfg: HFConfig, max_positions: int) -> None:
        super().__init__()
        self.config = cfg
        self.model = DecoderModel(cfg, self.spec, max_positions)
        self._init_lm_head(cfg)

    def _route(self, name: str) -> tuple[str, str | None]:
        """Map a checkpoint tensor name to ``(parameter name, shard id or None)``."""
        m = EXPERT_WEIGHT.match(name)
        if m:
            prefix, expert, which = m.groups()
            if which == "down_proj":
                return f"{prefix}.w2", expert
            return f"{prefix}.w13", f"{expert}:{which.removesuffix('_proj')}"
        m = FUSED_EXPERT_WEIGHT.match(name)
        if m:
            prefix, which = m.groups()
            return f"{prefix}.{'w13' if which == 'gate_up_proj' else 'w2'}", "fused"
        for ckpt, ours, shard in _STACKED:
            if ckpt in name:
                return name.replace(ckpt, ours), shard
        return name, None
