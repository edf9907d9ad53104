"""DeepSeek-V2 / V3 (and Kimi-K2, which is the V3 architecture): MLA attention + MoE.

Attention is multi-head latent attention (``runtime/layers/mla.py``): queries come from a
low-rank path (``q_a_proj`` -> ``q_a_layernorm`` -> ``q_b_proj``) or, without q LoRA as in
V2-Lite, from ``q_proj``; keys and values are compressed into one latent per token,
``kv_a_proj_with_mqa`` -> ``[kv_c (kv_lora_rank) | k_pe (qk_rope_head_dim)]``, with ``kv_c``
RMS-normed and ``k_pe`` a single rotated rope key shared by all heads. The KV cache stores
only that latent (576 values per token per layer for V3). The query's low-rank (or full)
projection and ``kv_a_proj_with_mqa`` read the same input, so they are one GEMM here.

RoPE on the rope dims is GPT-J style (interleaved pairs), as DeepSeek trained it; transformers'
``rope_interleave=False`` (neox halves) is honoured. YaRN scales cos/sin by its attention
factor, and the softmax scale is multiplied by ``mscale(factor, mscale_all_dim)^2``.

MLP: dense SwiGLU for the first ``first_k_dense_replace`` layers (and off the
``moe_layer_freq`` grid), otherwise routed experts plus ``n_shared_experts`` shared experts.
Routing: V3 uses sigmoid scores, the ``e_score_correction_bias`` only to choose experts,
grouped top-k (the best ``topk_group`` of ``n_group`` groups, a group scored by the sum of its
best two), optional renormalisation and ``routed_scaling_factor``; V2 uses softmax scores
(greedy, or the best ``topk_group`` groups by their best score for ``group_limited_greedy``).
The router GEMM runs in float32, as the reference does.

Multi-token prediction: the official V3 checkpoint stores ``num_nextn_predict_layers`` extra
layers as ``model.layers.{num_hidden_layers + i}.*`` (a decoder layer plus ``enorm``,
``hnorm``, ``eh_proj``, ``shared_head.{norm,head}`` and its own ``embed_tokens``). They load
into ``model.mtp_layers[i]``; the first drafts for ``--speculative-algorithm MTP``. A checkpoint
without them (transformers' own save format) drops them after loading; an override of
``num_nextn_predict_layers: 0`` skips them.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tokenspeed import kernels, mla
from tokenspeed.runtime.forward_batch import ForwardBatch
from tokenspeed.runtime.kv_pool import MLALayout
from tokenspeed.runtime.layers.embedding import LMHead, VocabEmbedding
from tokenspeed.runtime.layers.linear import Linear, MergedLinear
from tokenspeed.runtime.layers.mla import MLAAttention
from tokenspeed.runtime.layers.moe import FusedMoE
from tokenspeed.runtime.layers.norm import RMSNorm
from tokenspeed.runtime.layers.rotary import RotaryEmbedding
from tokenspeed.runtime.model_loader.config import HFConfig
from tokenspeed.runtime.models.decoder import (
    EXPERT_WEIGHT,
    FUSED_EXPERT_WEIGHT,
    CausalLM,
    DenseMLP,
    ModelBody,
    PreNormBlock,
)

logger = logging.getLogger("tokenspeed.models.deepseek")

# The q/kv LoRA norms use the reference's fixed epsilon, not rms_norm_eps.
_LORA_NORM_EPS = 1e-6


@dataclass(frozen=True)
class MLAConfig:
    """The attention and routing facts of a DeepSeek config (V2 and V3 spellings)."""

    is_v3: bool
    num_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    attention_bias: bool
    rope_neox: bool
    scale: float
    # MoE
    num_experts: int
    top_k: int
    moe_intermediate_size: int
    n_shared_experts: int
    first_k_dense_replace: int
    moe_layer_freq: int
    scoring: str
    use_correction_bias: bool
    n_group: int | None
    topk_group: int | None
    norm_topk_prob: bool
    routed_scaling_factor: float
    num_mtp_layers: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @classmethod
    def from_hf(cls, cfg: HFConfig) -> MLAConfig:
        is_v3 = cfg.architecture != "DeepseekV2ForCausalLM"
        nope, rope = int(cfg.raw["qk_nope_head_dim"]), int(cfg.raw["qk_rope_head_dim"])
        q_lora = cfg.get("q_lora_rank")
        topk_method = cfg.get("topk_method", "noaux_tc" if is_v3 else "greedy")
        grouped = is_v3 or topk_method == "group_limited_greedy"
        mtp = cfg.get("num_nextn_predict_layers", cfg.get("num_mtp_layers", 0))
        return cls(
            is_v3=is_v3,
            num_heads=cfg.num_heads,
            q_lora_rank=int(q_lora) if q_lora else None,
            kv_lora_rank=int(cfg.raw["kv_lora_rank"]),
            qk_nope_head_dim=nope,
            qk_rope_head_dim=rope,
            v_head_dim=int(cfg.raw["v_head_dim"]),
            attention_bias=bool(cfg.get("attention_bias", False)),
            rope_neox=is_v3 and not bool(cfg.get("rope_interleave", True)),
            scale=mla.softmax_scale_for(nope + rope, _softmax_mscale(cfg.rope_parameters)),
            num_experts=int(cfg.get("n_routed_experts", 0)),
            top_k=int(cfg.get("num_experts_per_tok", 0) or 0),
            moe_intermediate_size=int(cfg.get("moe_intermediate_size", 0)),
            n_shared_experts=int(cfg.get("n_shared_experts", 0)),
            first_k_dense_replace=int(cfg.get("first_k_dense_replace", 0)),
            moe_layer_freq=int(cfg.get("moe_layer_freq", 1)),
            scoring=str(cfg.get("scoring_func", "sigmoid" if is_v3 else "softmax")),
            use_correction_bias=is_v3,
            n_group=int(cfg.raw["n_group"]) if grouped and cfg.get("n_group") else None,
            topk_group=int(cfg.raw["topk_group"]) if grouped and cfg.get("topk_group") else None,
            norm_topk_prob=bool(cfg.get("norm_topk_prob", is_v3)),
            routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
            num_mtp_layers=int(mtp),
        )

    def is_moe_layer(self, layer_id: int) -> bool:
        return (
            self.num_experts > 0
            and layer_id >= self.first_k_dense_replace
            and layer_id % self.moe_layer_freq == 0
        )


def _softmax_mscale(rope: dict[str, Any]) -> float:
    """YaRN's ``0.1 * mscale_all_dim * ln(factor) + 1`` (1 without YaRN or mscale_all_dim)."""
    mscale_all_dim = rope.get("mscale_all_dim")
    factor = float(rope.get("factor") or 1.0)
    if rope.get("rope_type", "default") == "default" or not mscale_all_dim or factor <= 1:
        return 1.0
    return 0.1 * float(mscale_all_dim) * math.log(factor) + 1.0


class DeepseekAttention(nn.Module):
    """Projections, LoRA norms and RoPE around the latent attention core."""

    def __init__(self, cfg: HFConfig, mc: MLAConfig, layer_id: int, rotary: RotaryEmbedding):
        super().__init__()
        self.mc = mc
        h, r, rope = mc.num_heads, mc.kv_lora_rank, mc.qk_rope_head_dim
        q_out = mc.q_lora_rank if mc.q_lora_rank else h * mc.qk_head_dim
        # q (or q_a) and kv_a read the same input: one GEMM, unless their biases differ
        # (q_proj never has one; kv_a_proj_with_mqa has attention_bias).
        self.fused = mc.q_lora_rank is not None or not mc.attention_bias
        if self.fused:
            self.qkv_a_proj = MergedLinear(
                cfg.hidden_size, [q_out, r + rope], ["q", "kv_a"], bias=mc.attention_bias
            )
        else:
            self.q_proj = Linear(cfg.hidden_size, q_out)
            self.kv_a_proj_with_mqa = Linear(cfg.hidden_size, r + rope, bias=True)
        if mc.q_lora_rank:
            self.q_a_layernorm = RMSNorm(mc.q_lora_rank, _LORA_NORM_EPS)
            self.q_b_proj = Linear(mc.q_lora_rank, h * mc.qk_head_dim)
        self.kv_a_layernorm = RMSNorm(r, _LORA_NORM_EPS)
        self.o_proj = Linear(h * mc.v_head_dim, cfg.hidden_size, bias=mc.attention_bias)
        self.mla = MLAAttention(h, mc.qk_nope_head_dim, rope, mc.v_head_dim, r, layer_id, mc.scale)
        self.rotary = rotary  # shared by every layer (one cos/sin table)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        mc, t = self.mc, hidden.shape[0]
        if self.fused:
            q, latent = self.qkv_a_proj.forward_split(hidden)
        else:
            q, latent = self.q_proj(hidden), self.kv_a_proj_with_mqa(hidden)
        if mc.q_lora_rank:
            q = self.q_b_proj(self.q_a_layernorm(q.contiguous()))
        q = q.view(t, mc.num_heads, mc.qk_head_dim)
        kv_c = self.kv_a_layernorm(latent[:, : mc.kv_lora_rank].contiguous())
        k_pe = latent[:, mc.kv_lora_rank :].contiguous().view(t, 1, mc.qk_rope_head_dim)
        # in place on the rope dims of q (a strided view) and on k_pe
        self.rotary(positions, q[..., mc.qk_nope_head_dim :], k_pe)
        out = self.mla(q, kv_c, k_pe.view(t, mc.qk_rope_head_dim), batch)
        return self.o_proj(out)


class DeepseekRouter(nn.Module):
    """Router weight (float32, as the reference keeps it) and V3's selection bias."""

    def __init__(self, hidden_size: int, num_experts: int, correction_bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            torch.empty(num_experts, hidden_size, dtype=torch.float32), requires_grad=False
        )
        self.e_score_correction_bias = (
            nn.Parameter(torch.zeros(num_experts, dtype=torch.float32), requires_grad=False)
            if correction_bias
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.weight)


class DeepseekMoE(FusedMoE):
    """Routed experts (stacked ``w13``/``w2`` as in ``FusedMoE``) plus shared experts."""

    def __init__(self, cfg: HFConfig, mc: MLAConfig) -> None:
        super().__init__(
            num_experts=mc.num_experts,
            top_k=mc.top_k,
            hidden_size=cfg.hidden_size,
            intermediate_size=mc.moe_intermediate_size,
            renormalize=mc.norm_topk_prob,
            scoring=mc.scoring,
        )
        self.mc = mc
        self.gate = DeepseekRouter(cfg.hidden_size, mc.num_experts, mc.use_correction_bias)  # type: ignore[assignment]
        self.shared_experts = (
            DenseMLP(cfg.hidden_size, mc.moe_intermediate_size * mc.n_shared_experts, bias=False)
            if mc.n_shared_experts
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mc = self.mc
        weights, ids = kernels.moe_route(
            self.gate(x),
            mc.top_k,
            scoring=mc.scoring,
            renormalize=mc.norm_topk_prob,
            correction_bias=self.gate.e_score_correction_bias,
            n_group=mc.n_group,
            topk_group=mc.topk_group,
            routed_scaling_factor=mc.routed_scaling_factor,
        )
        out = kernels.fused_moe(x, self.w13, self.w2, weights, ids)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out


class DeepseekDecoderLayer(PreNormBlock):
    """MLA attention + dense or MoE MLP."""

    def __init__(self, cfg: HFConfig, mc: MLAConfig, layer_id: int, rotary: RotaryEmbedding):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DeepseekAttention(cfg, mc, layer_id, rotary)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if mc.is_moe_layer(layer_id):
            self.mlp = DeepseekMoE(cfg, mc)
        else:
            self.mlp = DenseMLP(cfg.hidden_size, int(cfg.raw["intermediate_size"]), bias=False)


class DeepseekSharedHead(nn.Module):
    """The MTP layer's own final norm and LM head."""

    def __init__(self, cfg: HFConfig) -> None:
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.head = LMHead(cfg.vocab_size, cfg.hidden_size)


class DeepseekMTPLayer(DeepseekDecoderLayer):
    """A multi-token-prediction layer: the drafter of ``--speculative-algorithm MTP``.

    Its attention's ``layer_id`` is ``num_hidden_layers + i``: it needs a KV layer of its own
    beyond the target model's (``kv_cache_layout(..., draft_layers=1)``).
    """

    def __init__(self, cfg: HFConfig, mc: MLAConfig, layer_id: int, rotary: RotaryEmbedding):
        super().__init__(cfg, mc, layer_id, rotary)
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.enorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.eh_proj = Linear(2 * cfg.hidden_size, cfg.hidden_size)
        self.shared_head = DeepseekSharedHead(cfg)

    def predict(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """Its own hidden state at each position, from the target's final ``hidden`` there
        and the token after it (``input_ids``), as DeepSeek-V3 trained it:
        ``eh_proj([enorm(embed(token)) | hnorm(hidden)])`` through one decoder layer and the
        shared head's norm. ``compute_logits`` of it predicts the token after ``input_ids``;
        fed back as ``hidden`` with that guess, it predicts one further."""
        x = torch.cat((self.enorm(self.embed_tokens(input_ids)), self.hnorm(hidden)), dim=-1)
        out, residual = super().forward(positions, self.eh_proj(x), None, batch)
        out, _ = self.shared_head.norm(out, residual)
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits of the shared head for the rows given."""
        return self.shared_head.head(hidden)


class DeepseekModel(ModelBody):
    """Embedding, decoder layers, final norm; the MTP layers run only as a drafter."""

    def __init__(self, cfg: HFConfig, mc: MLAConfig, max_positions: int) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary_emb = RotaryEmbedding(
            mc.qk_rope_head_dim,
            cfg.rope_parameters,
            max_positions,
            cfg.max_position_embeddings,
            is_neox=mc.rope_neox,
        )
        self.layers = nn.ModuleList(
            DeepseekDecoderLayer(cfg, mc, i, self.rotary_emb) for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mtp_layers = nn.ModuleList(
            DeepseekMTPLayer(cfg, mc, cfg.num_layers + i, self.rotary_emb)
            for i in range(mc.num_mtp_layers)
        )


_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.*)$")


class DeepseekV2ForCausalLM(CausalLM):
    """DeepSeek-V2 / V2-Lite (softmax routing); V3 and Kimi-K2 through the subclass below."""

    def __init__(self, cfg: HFConfig, max_positions: int) -> None:
        super().__init__()
        self.config = cfg
        self.mc = MLAConfig.from_hf(cfg)
        self.model = DeepseekModel(cfg, self.mc, max_positions)
        self._init_lm_head(cfg)

    def kv_cache_layout(
        self, page_size: int, dtype: torch.dtype, draft_layers: int = 0
    ) -> MLALayout:
        """The latent cache this model needs: ``kv_lora_rank + qk_rope_head_dim`` per token,
        for its layers and ``draft_layers`` MTP layers run as a drafter."""
        return MLALayout(
            num_layers=self.config.num_layers + draft_layers,
            kv_lora_rank=self.mc.kv_lora_rank,
            rope_dim=self.mc.qk_rope_head_dim,
            page_size=page_size,
            dtype=dtype,
        )

    def process_weights_after_loading(self) -> None:
        """Prepare the absorbed decode weights of every layer (after real or dummy loading)."""
        for module in self.modules():
            if isinstance(module, MLAAttention):
                module.process_weights_after_loading()

    # ---- loading ------------------------------------------------------------------------
    def _route(self, name: str) -> tuple[str | None, str | None]:
        """Checkpoint name -> ``(parameter name or None to skip, shard id or None)``."""
        m = _LAYER.match(name)
        if m and int(m.group(1)) >= self.config.num_layers:
            mtp = int(m.group(1)) - self.config.num_layers
            if mtp >= len(self.model.mtp_layers):
                return None, None  # MTP weights the config does not ask to hold
            name = f"model.mtp_layers.{mtp}.{m.group(2)}"
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
        fused_qkv = self.mc.q_lora_rank is not None or not self.mc.attention_bias
        stacked = [(".gate_proj.", ".gate_up_proj.", "gate"), (".up_proj.", ".gate_up_proj.", "up")]
        if fused_qkv:
            stacked += [
                (".self_attn.q_a_proj.", ".self_attn.qkv_a_proj.", "q"),
                (".self_attn.q_proj.", ".self_attn.qkv_a_proj.", "q"),
                (".self_attn.kv_a_proj_with_mqa.", ".self_attn.qkv_a_proj.", "kv_a"),
            ]
        for ckpt, ours, shard in stacked:
            if ckpt in name:
                return name.replace(ckpt, ours), shard
        return name.replace(".self_attn.kv_b_proj.", ".self_attn.mla.kv_b_proj."), None

    def _after_loading(self, loaded: dict[str, set[str]]) -> None:
        """MTP layers absent from the checkpoint are dropped (with a log line) rather than
        reported missing: transformers' own checkpoints never contain them. Present ones share
        the model's embedding and LM head where the checkpoint repeats them."""
        if len(self.model.mtp_layers) and not any(
            n.startswith("model.mtp_layers.") for n in loaded
        ):
            logger.info(
                "checkpoint has no multi-token-prediction layers; not holding %d MTP layer(s)",
                len(self.model.mtp_layers),
            )
            self.model.mtp_layers = nn.ModuleList()
        for mtp in self.model.mtp_layers:
            # DeepSeek's checkpoints repeat the model's embedding and LM head in each MTP layer
            # (1.85 GB each for V3 in bf16): hold one copy when they are the same
            if torch.equal(mtp.embed_tokens.weight, self.model.embed_tokens.weight):
                mtp.embed_tokens.weight = self.model.embed_tokens.weight
            if torch.equal(mtp.shared_head.head.weight, self.lm_head.weight):
                mtp.shared_head.head.weight = self.lm_head.weight


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    """DeepSeek-V3 / R1 and Kimi-K2/K2.5 text: sigmoid + correction-bias grouped routing."""
