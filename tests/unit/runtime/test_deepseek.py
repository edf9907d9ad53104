"""DeepSeek-V2/V3 (MLA + MoE) on the latent KV cache: parity with transformers.

Tiny random checkpoints saved by transformers (float32, yarn RoPE with mscale, grouped
routing with a random correction bias): greedy tokens through the real scheduler equal
transformers' ``generate`` with chunked prefill, prefix-cache hits, retraction with a host
tier; per-step logits from the executor within 1e-4; the V2 spelling (softmax routing, no q
LoRA); an FP8 latent cache; MTP weights held; the shipped DeepSeek-V3 config with dummy
weights.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from runtime_helpers import (
    assert_logprobs_match,
    hf_greedy,
    hf_model,
    make_prompts,
    run_without_scheduler,
)
from safetensors.torch import save_file

from tokenspeed.runtime import LLM, SamplingParams
from tokenspeed.runtime.drafting import Drafts
from tokenspeed.runtime.kv_pool import (
    HostKVPool,
    MLAKVPool,
    MLALayout,
    load_back,
    make_kv_pool,
    write_back,
)
from tokenspeed.runtime.model_executor import ExecutorConfig, ModelExecutor
from tokenspeed.runtime.model_loader import ModelLoadError, load_model

NUM_NEW = 16
VARIANTS = ["v3", "v3_no_q_lora", "v2"]
ROPE = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 128,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}


def make_deepseek_checkpoint(variant: str, path: Path) -> Path:
    """A float32 random tiny DeepSeek checkpoint saved by transformers."""
    import transformers as tf

    common: dict[str, object] = dict(
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        first_k_dense_replace=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        vocab_size=320,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_parameters=dict(ROPE),
        tie_word_embeddings=False,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    if variant == "v3":
        config, cls = tf.DeepseekV3Config(**common), tf.DeepseekV3ForCausalLM
    elif variant == "v3_no_q_lora":
        config, cls = (
            tf.DeepseekV3Config(**{**common, "q_lora_rank": None}),
            tf.DeepseekV3ForCausalLM,
        )
    elif variant == "v2":  # V2-Lite style: no q LoRA, softmax routing limited to the best group
        v2 = {**common, "q_lora_rank": None, "topk_method": "group_limited_greedy"}
        config, cls = tf.DeepseekV2Config(**v2), tf.DeepseekV2ForCausalLM
    else:
        raise ValueError(variant)
    torch.manual_seed(4321)
    model = cls(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
            elif "norm" in name:
                p.uniform_(0.8, 1.2)
            else:
                p.normal_(0.0, 0.05)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # a buffer in transformers
                b.normal_(0.0, 0.05)
    model.save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def ds_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("deepseek")
    return {v: make_deepseek_checkpoint(v, root / v) for v in VARIANTS}


@pytest.fixture(scope="module")
def ds_prompts() -> list[list[int]]:
    return make_prompts(seed=3)


@pytest.fixture(scope="module")
def ds_references(ds_checkpoints, ds_prompts) -> dict[str, tuple]:
    return {v: hf_greedy(hf_model(path), ds_prompts, NUM_NEW) for v, path in ds_checkpoints.items()}


GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_NEW, logprobs=0)


def make_llm(path: Path, **kw: object) -> LLM:
    args: dict[str, object] = dict(
        device="cpu", page_size=4, max_num_seqs=8, max_total_tokens=4096, seed=0
    )
    args.update(kw)
    return LLM(str(path), **args)


def tokens_of(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("variant", VARIANTS)
def test_chunked_prefill_and_prefix_hits_match_transformers(
    ds_checkpoints, ds_prompts, ds_references, variant
):
    """Chunked prefill (16-token budget), then prefix hits from the first call's pages."""
    llm = make_llm(ds_checkpoints[variant], chunked_prefill_size=16, enable_prefix_caching=True)
    assert type(llm.engine.executor.kv_pool) is MLAKVPool
    ref_tokens, ref_logits = ds_references[variant]
    first = llm.generate(ds_prompts[:4], GREEDY)
    assert llm.engine.num_steps > NUM_NEW + 4  # prompts were split over several steps
    second = llm.generate(ds_prompts, GREEDY)
    assert tokens_of(first) == ref_tokens[:4]
    assert tokens_of(second) == ref_tokens
    assert_logprobs_match(first, ref_logits[:4])
    assert_logprobs_match(second, ref_logits)
    hits = [o.metrics.cache_tokens for o in second]
    assert all(h > 0 for h in hits[:4])  # the repeated prompts reused their cached latents
    assert llm.engine.stats()["prefix_cache_hit_tokens"] >= sum(hits)


def test_whole_prompts_in_one_step_match_transformers(ds_checkpoints, ds_prompts, ds_references):
    llm = make_llm(ds_checkpoints["v3"], enable_prefix_caching=False)
    outs = llm.generate(ds_prompts, GREEDY)
    assert tokens_of(outs) == ds_references["v3"][0]
    assert_logprobs_match(outs, ds_references["v3"][1])


def test_retraction_with_host_tier_matches_transformers(ds_checkpoints, ds_prompts, ds_references):
    """Latent pages written back to the host tier and loaded again keep parity."""
    llm = make_llm(
        ds_checkpoints["v3"],
        max_total_tokens=240,
        enable_prefix_caching=True,
        host_kv_cache_memory=4 << 20,
    )
    outs = llm.generate(ds_prompts, GREEDY)
    assert tokens_of(outs) == ds_references["v3"][0]
    ex = llm.engine.executor
    assert llm.engine.stats()["num_preemptions"] > 0
    assert ex.pages_written_back > 0 and ex.pages_loaded_back > 0


def _executor(path: Path, **kw: object) -> ModelExecutor:
    args: dict[str, object] = dict(
        device="cpu", page_size=4, max_total_tokens=1024, max_num_seqs=8, seed=0
    )
    args.update(kw)
    return ModelExecutor(ExecutorConfig(model_path=path, **args))  # type: ignore[arg-type]


@pytest.mark.parametrize("variant", ["v3", "v2"])
def test_executor_logits_match_transformers(ds_checkpoints, ds_prompts, ds_references, variant):
    """Every step's full logits (prefill in 7-token chunks, then absorbed decode) to 1e-4."""
    ex = _executor(ds_checkpoints[variant])
    tokens, logits = run_without_scheduler(ex, ds_prompts, NUM_NEW, chunk=7)
    ref_tokens, ref_logits = ds_references[variant]
    assert tokens == ref_tokens
    for ours, ref in zip(logits, ref_logits, strict=True):
        torch.testing.assert_close(torch.stack(ours), ref, atol=1e-4, rtol=0)


def test_fp8_latent_cache(ds_checkpoints, ds_prompts, ds_references):
    """An FP8 (e4m3, per-token scale) latent cache stays close to transformers' float32 run."""
    ex = _executor(ds_checkpoints["v3"], kv_cache_dtype="fp8_e4m3")
    pool = ex.kv_pool
    assert isinstance(pool, MLAKVPool) and pool.scale_buffers is not None
    assert pool.kv_buffers[0].dtype == torch.float8_e4m3fn
    tokens, logits = run_without_scheduler(ex, ds_prompts[:4], 4, chunk=9)
    assert float(pool.scale_buffers[0].abs().sum()) > 0  # per-token scales were written
    ref_tokens, ref_logits = ds_references["v3"]
    for i in range(4):
        # Decode reads every cached latent as FP8 and later prefill chunks read the prefix
        # as FP8; everything else is float32. The error is e4m3 rounding (3 mantissa bits):
        # visible (so the cache really is FP8), small against logits of magnitude ~1.
        err = (torch.stack(logits[i]) - ref_logits[i][:4]).abs()
        assert 1e-3 < float(err.mean()) < 0.05 and float(err.max()) < 0.25
        assert tokens[i] == ref_tokens[i][:4]


def test_fp8_option_end_to_end_and_refusals(ds_checkpoints, ds_prompts, checkpoints):
    llm = make_llm(ds_checkpoints["v3"], kv_cache_dtype="fp8")
    assert llm.engine.executor.kv_pool.layout.dtype == torch.float8_e4m3fn
    outs = llm.generate(ds_prompts[:2], SamplingParams(temperature=0.0, max_tokens=4))
    assert [len(o.outputs[0].token_ids) for o in outs] == [4, 4]
    with pytest.raises(ValueError, match="not supported by the paged backend"):
        _executor(checkpoints["llama"], kv_cache_dtype="fp8_e4m3")
    with pytest.raises(ValueError, match="not supported in this build"):
        make_llm(ds_checkpoints["v3"], kv_cache_dtype="fp8_e5m2")


def test_mla_pool_layout_and_host_round_trip():
    layout = MLALayout(
        num_layers=2, kv_lora_rank=512, rope_dim=64, page_size=4, dtype=torch.bfloat16
    )
    assert layout.latent_dim == 576
    assert layout.bytes_per_page == 2 * 4 * 576 * 2
    fp8 = MLALayout(2, 512, 64, 4, torch.float8_e4m3fn)
    assert fp8.bytes_per_page == 2 * 4 * (576 + 4)  # one byte per value + a float32 scale
    dev = make_kv_pool(fp8, 6, torch.device("cpu"))
    assert isinstance(dev, MLAKVPool) and dev.kv_buffers[0].shape == (7, 4, 576)
    assert dev.scale_buffers is not None and dev.scale_buffers[1].shape == (7, 4)
    host = HostKVPool(fp8, 3, pin=False)
    for t in dev.buffers:
        t.view(torch.uint8).copy_(torch.randint(0, 120, t.view(torch.uint8).shape))
    before = [t.view(torch.uint8).clone() for t in dev.buffers]
    write_back(dev, host, np.array([5, 2]), np.array([0, 2]))
    for t in dev.buffers:
        t.view(torch.uint8).zero_()
    load_back(host, dev, [2, 0], [1, 3])  # page 2 -> host 2 -> 1; page 5 -> host 0 -> 3
    for got, want in zip(dev.buffers, before, strict=True):
        assert torch.equal(got.view(torch.uint8)[1], want[2])
        assert torch.equal(got.view(torch.uint8)[3], want[5])


def _with_mtp(
    src: Path, dst: Path, drop: str | None = None, repeat_head: bool = False
) -> dict[str, torch.Tensor]:
    """Copy a checkpoint and add one MTP layer as the official V3 checkpoint stores it (with
    ``repeat_head``, its embedding and head are the model's, as DeepSeek ships them)."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 1
    (dst / "config.json").write_text(json.dumps(cfg))
    layer = cfg["num_hidden_layers"]
    g = torch.Generator().manual_seed(0)
    extra: dict[str, torch.Tensor] = {}
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    for name, shape in [
        ("embed_tokens.weight", (vocab, h)),
        ("enorm.weight", (h,)),
        ("hnorm.weight", (h,)),
        ("eh_proj.weight", (h, 2 * h)),
        ("shared_head.norm.weight", (h,)),
        ("shared_head.head.weight", (vocab, h)),
    ]:
        scale = 0.08 if len(shape) == 2 else 0.1
        extra[f"model.layers.{layer}.{name}"] = (
            1.0 * (len(shape) == 1) + torch.randn(shape, generator=g) * scale
        )
    from safetensors import safe_open

    with safe_open(str(src / "model.safetensors"), "pt") as f:
        for name in f.keys():  # noqa: SIM118
            if name.startswith(f"model.layers.{layer - 1}."):  # a MoE layer's shapes, redrawn
                like = f.get_tensor(name)
                if like.dim() >= 2:
                    new = torch.randn(like.shape, generator=g) * 0.08
                elif "norm" in name:
                    new = torch.rand(like.shape, generator=g) * 0.4 + 0.8
                else:
                    new = torch.randn(like.shape, generator=g) * 0.05
                extra[name.replace(f"layers.{layer - 1}.", f"layers.{layer}.")] = new
    if repeat_head:
        with safe_open(str(src / "model.safetensors"), "pt") as f:
            extra[f"model.layers.{layer}.embed_tokens.weight"] = f.get_tensor(
                "model.embed_tokens.weight"
            )
            extra[f"model.layers.{layer}.shared_head.head.weight"] = f.get_tensor("lm_head.weight")
    if drop:
        extra.pop(drop)
    save_file(extra, str(dst / "mtp.safetensors"))
    return extra


def test_mtp_layer_weights_are_held(ds_checkpoints, ds_prompts, ds_references, tmp_path):
    extra = _with_mtp(ds_checkpoints["v3"], tmp_path / "mtp")
    model = load_model(tmp_path / "mtp")[0]
    (mtp,) = model.model.mtp_layers
    assert mtp.self_attn.mla.layer_id == 3
    torch.testing.assert_close(mtp.eh_proj.weight, extra["model.layers.3.eh_proj.weight"])
    torch.testing.assert_close(
        mtp.shared_head.head.weight, extra["model.layers.3.shared_head.head.weight"]
    )
    gate_up = mtp.mlp.w13[5]  # expert 5: gate rows then up rows
    torch.testing.assert_close(gate_up[:32], extra["model.layers.3.mlp.experts.5.gate_proj.weight"])
    torch.testing.assert_close(
        mtp.self_attn.qkv_a_proj.weight[32:],
        extra["model.layers.3.self_attn.kv_a_proj_with_mqa.weight"],
    )
    assert mtp.self_attn.mla.w_uk.shape == (4, 16, 32)  # absorbed weights prepared too
    # Held, not run: generation is unchanged.
    outs = make_llm(tmp_path / "mtp").generate(ds_prompts[:2], GREEDY)
    assert tokens_of(outs) == ds_references["v3"][0][:2]
    assert mtp.embed_tokens.weight is not model.model.embed_tokens.weight
    # The embedding and head DeepSeek repeats in the MTP layer are held once.
    _with_mtp(ds_checkpoints["v3"], tmp_path / "repeated", repeat_head=True)
    repeated = load_model(tmp_path / "repeated")[0]
    (mtp,) = repeated.model.mtp_layers
    assert mtp.embed_tokens.weight is repeated.model.embed_tokens.weight
    assert mtp.shared_head.head.weight is repeated.lm_head.weight
    # A checkpoint without MTP tensors (transformers' format) holds none.
    assert len(load_model(ds_checkpoints["v3"])[0].model.mtp_layers) == 0
    # An incomplete MTP layer is a clear error.
    _with_mtp(ds_checkpoints["v3"], tmp_path / "broken", drop="model.layers.3.hnorm.weight")
    with pytest.raises(ModelLoadError, match="mtp_layers.0.hnorm.weight"):
        load_model(tmp_path / "broken")


def test_dummy_deepseek_v3_builds_and_generates():
    small = {
        "num_hidden_layers": 2,
        "first_k_dense_replace": 1,
        "hidden_size": 128,
        "intermediate_size": 256,
        "moe_intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": 64,
        "kv_lora_rank": 64,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "n_routed_experts": 16,
        "vocab_size": 512,
        "max_position_embeddings": 2048,
    }
    llm = LLM(
        "deepseek-v3",
        load_format="dummy",
        hf_overrides=small,
        device="cpu",
        dtype="float32",
        max_total_tokens=512,
        page_size=16,
    )
    ex = llm.engine.executor
    layout = ex.kv_pool.layout
    assert isinstance(layout, MLALayout) and layout.latent_dim == 64 + 16
    model = ex.model
    assert type(model).__name__ == "DeepseekV3ForCausalLM"
    assert model.mc.n_group == 8 and model.mc.topk_group == 4 and model.mc.scoring == "sigmoid"
    assert len(model.model.mtp_layers) == 1  # the config asks for one; dummy weights fill it
    outs = llm.generate([[1, 2, 3, 4, 5], [7, 8]], SamplingParams(temperature=0.0, max_tokens=6))
    assert [len(o.outputs[0].token_ids) for o in outs] == [6, 6]


@pytest.mark.parametrize("variant", VARIANTS)
def test_ngram_speculative_decoding_keeps_parity(
    ds_checkpoints, ds_prompts, ds_references, variant
):
    """Drafted blocks verify as multi-token queries of the absorbed MLA decode (causal inside
    the block, blocks padded to one width), and as an extend in mixed steps."""
    llm = make_llm(ds_checkpoints[variant], speculative_algorithm="NGRAM")
    outs = llm.generate(ds_prompts, GREEDY)
    assert tokens_of(outs) == ds_references[variant][0]
    assert_logprobs_match(outs, ds_references[variant][1])
    ex = llm.engine.executor
    assert ex.spec_accepted > 0 and ex.spec_multi_token_steps > 0
    mixed = make_llm(ds_checkpoints[variant], speculative_algorithm="NGRAM",
                     chunked_prefill_size=16, enable_mixed_batch=True, max_num_seqs=4)  # fmt: skip
    assert tokens_of(mixed.generate(ds_prompts, GREEDY)) == ds_references[variant][0]


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="the Triton MLA kernels run on CPU in Triton's interpreter (the MLA tests turn it on)",
)
def test_ngram_blocks_through_the_triton_decode(ds_checkpoints, ds_prompts, ds_references):
    """The portable Triton decode (what GPUs without the CuTe kernels run) reads a verify
    step's per-request views of its per-row tables and lengths: transformers' tokens."""
    llm = make_llm(ds_checkpoints["v3"], speculative_algorithm="NGRAM", attention_backend="triton",
                   page_size=16)  # fmt: skip
    outs = llm.generate(ds_prompts, GREEDY)
    assert tokens_of(outs) == ds_references["v3"][0]
    assert llm.engine.executor.spec_multi_token_steps > 0


# ---- MTP speculative decoding -------------------------------------------------------------
MTP = dict(speculative_algorithm="MTP", speculative_num_steps=3, speculative_num_draft_tokens=4)


@pytest.fixture(scope="module")
def ds_mtp(ds_checkpoints, tmp_path_factory) -> dict[str, tuple[Path, dict[str, torch.Tensor]]]:
    """Each variant with one MTP layer (random: its drafts are rarely right)."""
    root = tmp_path_factory.mktemp("deepseek-mtp")
    return {v: (root / v, _with_mtp(path, root / v)) for v, path in ds_checkpoints.items()}


@pytest.mark.parametrize("variant", VARIANTS)
def test_mtp_speculative_decoding_keeps_parity(ds_mtp, ds_prompts, ds_references, variant):
    """MTP drafts verified as multi-token decode queries and in mixed steps: the tokens and
    logprobs of plain decoding, with the MTP layer's latents in a pool layer of their own."""
    path = ds_mtp[variant][0]
    llm = make_llm(path, **MTP)
    outs = llm.generate(ds_prompts, GREEDY)
    assert tokens_of(outs) == ds_references[variant][0]
    assert_logprobs_match(outs, ds_references[variant][1])
    ex = llm.engine.executor
    assert ex.kv_pool.layout.num_layers == 3 + 1
    assert ex.spec_drafted > 0 and ex.spec_multi_token_steps > 0
    mixed = make_llm(path, **MTP, chunked_prefill_size=16, enable_mixed_batch=True, max_num_seqs=4)
    assert tokens_of(mixed.generate(ds_prompts, GREEDY)) == ds_references[variant][0]


def _hf_mtp_layer(hf: torch.nn.Module, extra: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The MTP layer's decoder block as a transformers layer (a copy of the last one, loaded
    with the MTP tensors)."""
    import copy

    layer = copy.deepcopy(hf.model.layers[-1])
    prefix = f"model.layers.{hf.config.num_hidden_layers}."
    own = ("embed_tokens.", "enorm.", "hnorm.", "eh_proj.", "shared_head.")
    state = {
        k.removeprefix(prefix): v
        for k, v in extra.items()
        if not k.removeprefix(prefix).startswith(own)
    }
    experts = len(layer.mlp.experts.gate_up_proj)  # the checkpoint's per-expert tensors, fused
    one = [{p: state.pop(f"mlp.experts.{e}.{p}_proj.weight") for p in ("gate", "up", "down")}
           for e in range(experts)]  # fmt: skip
    state["mlp.experts.gate_up_proj"] = torch.stack([torch.cat([x["gate"], x["up"]]) for x in one])
    state["mlp.experts.down_proj"] = torch.stack([x["down"] for x in one])
    layer.load_state_dict(state, strict=True)
    return layer


def _mtp_reference(
    hf: torch.nn.Module, layer: torch.nn.Module, extra: dict[str, torch.Tensor],
    tokens: list[int], count: int,
) -> tuple[list[int], list[torch.Tensor]]:  # fmt: skip
    """Drafts (and the MTP layer's hidden state that gave each) after ``tokens`` from scratch: transformers' final hidden states of the target,
    then the MTP layer over the whole sequence (causal), one row more per draft, each row
    ``eh_proj([enorm(embed(next token)) | hnorm(hidden)])``, the shared head's norm and head."""
    w = {
        k.removeprefix(f"model.layers.{hf.config.num_hidden_layers}."): v for k, v in extra.items()
    }
    eps = hf.config.rms_norm_eps

    def rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    with torch.no_grad():
        hidden = list(hf.model(torch.tensor([tokens[:-1]])).last_hidden_state[0])
        nexts = list(tokens[1:])
        drafts: list[int] = []
        states: list[torch.Tensor] = []
        for _ in range(count):
            emb = w["embed_tokens.weight"][torch.tensor(nexts)]
            x = torch.cat(
                [rms(emb, w["enorm.weight"]), rms(torch.stack(hidden), w["hnorm.weight"])], -1
            )
            x = (x @ w["eh_proj.weight"].T)[None]
            n = x.shape[1]
            pos = torch.arange(n)[None]
            mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
            out = layer(x, attention_mask=mask, position_ids=pos,
                        position_embeddings=hf.model.rotary_emb(x, pos))  # fmt: skip
            out = out[0] if isinstance(out, tuple) else out
            g = rms(out[0, -1], w["shared_head.norm.weight"])
            drafts.append(int((g @ w["shared_head.head.weight"].T).argmax()))
            states.append(g)
            nexts.append(drafts[-1])
            hidden.append(g)
    return drafts, states


def test_mtp_drafts_equal_a_from_scratch_reference(ds_mtp, ds_prompts, ds_references):
    """Every proposal, and the MTP layer's hidden state behind each draft, equals the layer
    run from scratch over the whole sequence, through chunked prefill, a conversation's turns
    hitting its own earlier pages, retraction with a host tier, and verified blocks that kept
    some drafts: the engine is fed the right next tokens as two of its three drafts, so blocks
    are accepted in part and the MTP layer's cache must follow the kept positions only.

    (Requests that diverge right after a shared page are left out: that page's last MTP entry
    saw one request's next token, so the others' drafts are near, not equal, to scratch.)"""
    path, extra = ds_mtp["v3"]
    hf = hf_model(path)
    layer = _hf_mtp_layer(hf, extra)
    ref_tokens = ds_references["v3"][0]
    seen: list[tuple[list[int], list[int], list[torch.Tensor]]] = []

    def record(llm: LLM, feed: bool = True) -> None:
        drafter = llm.engine.executor.drafter
        real = drafter.propose

        def propose(slots, positions, tables, count):
            chain: list[torch.Tensor] = []  # the hidden state of each further draft
            predict = drafter.layer.predict
            drafter.layer.predict = lambda *a: chain.append(predict(*a)) or chain[-1]
            try:
                got = real(slots, positions, tables, count)
            finally:
                del drafter.layer.predict
            fed, ready = [], 0
            per_request = got.per_request()
            for slot, pos, drafts in zip(slots.tolist(), positions.tolist(), per_request,
                                         strict=True):  # fmt: skip
                hist = drafter.history.tokens(slot).tolist()
                assert len(hist) == pos + 1
                if len(drafts):
                    states = [drafter.carry[slot], *(c[ready] for c in chain)]
                    seen.append((hist, drafts.tolist(), [x.clone() for x in states]))
                    ready += 1
                i = max((i for i, p in enumerate(ds_prompts) if hist[: len(p)] == p),
                        key=lambda i: len(ds_prompts[i]))  # fmt: skip
                done = len(hist) - len(ds_prompts[i])
                right = ref_tokens[i][done : done + 2]
                fed.append(np.array([*right, (right[-1] + 1) % 320] if right else [], np.int64))
            if not feed:
                return got
            return Drafts(np.fromiter(map(len, fed), np.int64, len(fed)), np.concatenate(fed))

        drafter.propose = propose

    chunked = make_llm(path, **MTP, chunked_prefill_size=16, enable_prefix_caching=False)
    record(chunked)
    assert tokens_of(chunked.generate(ds_prompts, GREEDY)) == ref_tokens
    ex = chunked.engine.executor
    assert ex.spec_accepted > 0 and ex.spec_accepted < ex.spec_drafted
    # a conversation: each turn is the last one, its answer and a few new tokens
    turns = make_llm(path, **MTP, enable_prefix_caching=True)
    record(turns, feed=False)
    conversation = list(ds_prompts[0])
    for turn in range(3):
        (out,) = turns.generate([conversation], SamplingParams(temperature=0.0, max_tokens=6))
        assert out.metrics.cache_tokens >= (len(conversation) - 12 if turn else 0)
        conversation += [*out.outputs[0].token_ids, 7 + turn, 11, 13]
    # prompts sharing no page, so that retraction resumes from pages only they wrote
    retracting = make_llm(path, **MTP, max_total_tokens=120, enable_prefix_caching=True,
                          host_kv_cache_memory=4 << 20)  # fmt: skip
    record(retracting)
    outs = retracting.generate(ds_prompts[1::2], GREEDY)
    assert tokens_of(outs) == ref_tokens[1::2]
    assert retracting.engine.stats()["num_preemptions"] > 0
    assert len(seen) > 50
    for hist, drafts, states in seen:
        want, want_states = _mtp_reference(hf, layer, extra, hist, len(drafts))
        assert drafts == want, hist
        torch.testing.assert_close(torch.stack(states), torch.stack(want_states), atol=1e-4, rtol=0)


class _EagerGraphs:
    """Stands in for the MTP layer's CUDA-graph runner on CPU: the same contract (the
    hidden states written into the module's static buffer, the output in a static buffer
    the next replay overwrites), run eagerly. Both buffers are poisoned between replays, so
    a drafter that skips the copy in or reads a stale output drafts from NaNs."""

    def __init__(self, drafter, rows: int) -> None:
        self.model = drafter.graph_module(rows)
        self.backend = drafter.backend
        self.rows = rows
        self.output = torch.full_like(self.model.hidden, float("nan"))
        self.replays = 0

    def can_run(self, batch) -> bool:
        from tokenspeed.runtime.forward_batch import ForwardMode

        return batch.mode is ForwardMode.DECODE and batch.batch_size <= self.rows

    def replay(self, batch) -> torch.Tensor:
        n = batch.batch_size
        self.backend.init_forward_metadata(batch)
        self.output.fill_(float("nan"))
        self.output[:n].copy_(self.model(batch.input_ids, batch.positions, batch))
        self.model.hidden.fill_(float("nan"))
        self.replays += 1
        return self.output[:n]


def test_mtp_graph_path_drafts_as_the_eager_layer(ds_mtp, ds_prompts, ds_references):
    """The drafter's CUDA-graph path (observe after decode steps, the chained drafts) feeds
    the runner's static buffers and reads its output in time: the same drafts, step for
    step, as the layer run eagerly, and plain decoding's tokens."""
    path, _ = ds_mtp["v3"]
    drafts: list[list[list[int]]] = [[], []]
    runners = []
    for run in range(2):
        llm = make_llm(path, **MTP, max_num_seqs=4)
        drafter = llm.engine.executor.drafter
        if run:
            drafter.graphs = _EagerGraphs(drafter, rows=8)  # some observes do not fit: eager
            runners.append(drafter.graphs)
        real = drafter.propose

        def propose(*args, real=real, seen=drafts[run]):
            got = real(*args)
            seen.append([d.tolist() for d in got.per_request()])
            return got

        drafter.propose = propose
        assert tokens_of(llm.generate(ds_prompts, GREEDY)) == ds_references["v3"][0]
    assert drafts[0] == drafts[1] and sum(len(d) for s in drafts[0] for d in s) > 50
    assert runners[0].replays > 10


def test_speculative_decoding_over_an_fp8_latent_cache(ds_mtp, ds_prompts):
    """Drafted blocks verify over an FP8 cache (the MTP layer's own latents quantized too):
    the same tokens as plain decoding over that cache, NGRAM and MTP alike."""
    path, _ = ds_mtp["v3"]
    want = tokens_of(make_llm(path, kv_cache_dtype="fp8_e4m3").generate(ds_prompts, GREEDY))
    for spec in (dict(speculative_algorithm="NGRAM"), MTP):
        llm = make_llm(path, kv_cache_dtype="fp8_e4m3", **spec)
        assert tokens_of(llm.generate(ds_prompts, GREEDY)) == want, spec
        ex = llm.engine.executor
        assert ex.kv_pool.layout.is_fp8 and ex.spec_multi_token_steps > 0


def test_mtp_needs_an_mtp_layer(ds_checkpoints, checkpoints):
    for path in (ds_checkpoints["v3"], checkpoints["llama"]):
        with pytest.raises(ValueError, match="multi-token-prediction layer"):
            make_llm(path, **MTP)
