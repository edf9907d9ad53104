"""Checkpoint loading: errors, sharded files, tied embeddings, rope scaling, dummy weights."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from runtime_helpers import Op, hf_model, make_tiny_checkpoint

from tokenspeed.runtime.forward_batch import ForwardMode
from tokenspeed.runtime.layers.rotary import build_cos_sin_cache
from tokenspeed.runtime.model_executor import ExecutorConfig, ModelExecutor
from tokenspeed.runtime.model_loader import ModelLoadError, load_model


def _prefill_logits(path, prompt: list[int], **cfg) -> torch.Tensor:
    """Our last-position logits for one prompt (single request, one page table row)."""
    ex = ModelExecutor(
        ExecutorConfig(model_path=path, device="cpu", page_size=4, max_total_tokens=512, **cfg)
    )
    from tokenspeed.runtime.sampling import SamplingParams

    ex.install_request(0, SamplingParams(temperature=0.0), 0, prompt, [])
    n = len(prompt)
    op = Op(
        mode=ForwardMode.EXTEND,
        request_ids=["a"],
        request_pool_indices=np.zeros(1, np.int32),
        prefix_lens=np.zeros(1, np.int32),
        extend_lens=np.array([n], np.int32),
        seq_lens=np.array([n], np.int32),
        input_ids=np.array(prompt, np.int32),
        block_tables=np.arange(-(-n // 4), dtype=np.int32)[None],
        sample_mask=np.ones(1, bool),
    )
    return ex.execute(op, return_logits=True).logits[0]


def _hf_last_logits(path, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(path)(torch.tensor([prompt])).logits[0, -1]


PROMPT = list(range(5, 60, 2))


def test_not_a_model_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="not a model directory"):
        load_model(tmp_path)


def test_missing_path(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "nope")


def test_unsupported_architecture(checkpoints, tmp_path):
    path = shutil.copytree(checkpoints["qwen3"], tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    cfg["architectures"] = ["GPTNeoXForCausalLM"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="unsupported architecture 'GPTNeoXForCausalLM'"):
        load_model(path)


def test_no_weights(checkpoints, tmp_path):
    path = tmp_path / "m"
    path.mkdir()
    shutil.copy(checkpoints["qwen3"] / "config.json", path)
    with pytest.raises(ModelLoadError, match="no \\*.safetensors"):
        load_model(path)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """A Qwen3 checkpoint saved in several shards with an index."""
    from transformers import AutoModelForCausalLM

    src = make_tiny_checkpoint("qwen3", tmp_path_factory.mktemp("src") / "m")
    out = tmp_path_factory.mktemp("sharded") / "m"
    AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).save_pretrained(
        out, max_shard_size="60KB"
    )
    return out


def test_sharded_checkpoint_loads_and_matches(sharded):
    shards = sorted(sharded.glob("*.safetensors"))
    assert len(shards) > 2 and (sharded / "model.safetensors.index.json").is_file()
    torch.testing.assert_close(
        _prefill_logits(sharded, PROMPT), _hf_last_logits(sharded, PROMPT), atol=1e-4, rtol=0
    )


def test_missing_shard_is_named(sharded, tmp_path):
    path = shutil.copytree(sharded, tmp_path / "m")
    victim = sorted(path.glob("*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(ModelLoadError, match=f"shard\\(s\\) {victim.name}"):
        load_model(path)


def test_missing_weight_is_reported(checkpoints, tmp_path):
    from safetensors.torch import load_file, save_file

    path = shutil.copytree(checkpoints["llama"], tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="lacks 1 weight"):
        load_model(path)


def test_tied_embeddings_and_qwen2_bias(tmp_path):
    path = make_tiny_checkpoint("qwen2", tmp_path / "q2", tie_word_embeddings=True)
    model, cfg, _ = load_model(path)
    assert cfg.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert model.model.layers[0].self_attn.qkv_proj.bias is not None
    torch.testing.assert_close(
        _prefill_logits(path, PROMPT), _hf_last_logits(path, PROMPT), atol=1e-4, rtol=0
    )


ROPES = {
    "linear": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
        "rope_theta": 500000.0,
    },
    "yarn": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 128,
        "rope_theta": 10000.0,
    },
}


@pytest.mark.parametrize("name", sorted(ROPES))
def test_rope_scaling_tables_match_transformers(name):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    params = ROPES[name]
    cfg = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        head_dim=16,
        max_position_embeddings=512,
        rope_parameters=dict(params),
    )
    rope = LlamaRotaryEmbedding(cfg)
    positions = torch.arange(512)[None]
    cos, sin = rope(torch.zeros(1, dtype=torch.float32), positions)
    ours, rot = build_cos_sin_cache(16, dict(params), 512, 512)
    assert rot == 16
    torch.testing.assert_close(ours[:, :8], cos[0, :, :8], atol=1e-5, rtol=0)
    torch.testing.assert_close(ours[:, 8:], sin[0, :, :8], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["llama3", "yarn"])
def test_scaled_rope_model_matches_transformers(tmp_path, name):
    path = make_tiny_checkpoint("llama", tmp_path / name, rope_parameters=dict(ROPES[name]))
    long_prompt = (PROMPT * 6)[:150]
    torch.testing.assert_close(
        _prefill_logits(path, long_prompt), _hf_last_logits(path, long_prompt), atol=1e-4, rtol=0
    )


def test_dummy_weights_with_hf_overrides(checkpoints):
    model, cfg, dtype = load_model(
        checkpoints["qwen3_moe"],
        load_format="dummy",
        hf_overrides={"num_hidden_layers": 1, "rope_parameters": {"rope_theta": 5000.0}},
        dtype="bfloat16",
    )
    assert cfg.num_layers == 1 and len(model.model.layers) == 1
    assert cfg.rope_parameters["rope_theta"] == 5000.0
    assert cfg.rope_parameters["rope_type"] == "default"  # untouched sibling key survives
    assert dtype == torch.bfloat16 and model.model.embed_tokens.weight.dtype == torch.bfloat16
    w = model.model.layers[0].mlp.w13
    assert w.abs().sum() > 0 and torch.isfinite(w).all()
    again, _, _ = load_model(
        checkpoints["qwen3_moe"],
        load_format="dummy",
        hf_overrides={"num_hidden_layers": 1},
        dtype="bfloat16",
    )
    assert torch.equal(again.model.layers[0].mlp.w13, w)  # seeded: repeatable


def test_dummy_from_config_only_dir(tmp_path, checkpoints):
    path = tmp_path / "cfg_only"
    path.mkdir()
    shutil.copy(checkpoints["llama"] / "config.json", path)
    logits = _prefill_logits(path, PROMPT, load_format="dummy")
    assert logits.shape == (320,) and torch.isfinite(logits).all()


def test_fused_expert_checkpoint_layout(checkpoints, tmp_path):
    """Experts stored fused (``experts.gate_up_proj`` [E, 2I, H]) load like per-expert ones."""
    from safetensors.torch import load_file, save_file

    src = checkpoints["qwen3_moe"]
    path = shutil.copytree(src, tmp_path / "fused")
    tensors = load_file(path / "model.safetensors")
    for layer in range(2):
        p = f"model.layers.{layer}.mlp.experts"
        gate = [tensors.pop(f"{p}.{e}.gate_proj.weight") for e in range(8)]
        up = [tensors.pop(f"{p}.{e}.up_proj.weight") for e in range(8)]
        down = [tensors.pop(f"{p}.{e}.down_proj.weight") for e in range(8)]
        tensors[f"{p}.gate_up_proj"] = torch.stack(
            [torch.cat([g, u]) for g, u in zip(gate, up, strict=True)]
        )
        tensors[f"{p}.down_proj"] = torch.stack(down)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    torch.testing.assert_close(_prefill_logits(path, PROMPT), _prefill_logits(src, PROMPT))
