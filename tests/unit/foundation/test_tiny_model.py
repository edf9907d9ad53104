"""The embedded tiny model: same bytes every time, a real HF checkpoint transformers loads."""

import hashlib
import json

import pytest

from tokenspeed.runtime.config import ConfigError
from tokenspeed.runtime.model_source import resolve_model_path, shipped_architectures
from tokenspeed.runtime.tiny_model import ensure_tiny_model, write_tiny_model

FILES = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
]


def digests(directory):
    return {n: hashlib.sha256((directory / n).read_bytes()).hexdigest() for n in FILES}


def test_same_bytes_every_time(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    write_tiny_model(first)
    write_tiny_model(second)
    assert digests(first) == digests(second)


def test_ensure_is_idempotent_and_cached(tmp_path):
    path = ensure_tiny_model(tmp_path)
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(tmp_path) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime
    assert [p.name for p in (tmp_path / "models").iterdir()] == [path.name]


def test_loads_in_transformers_and_generates(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = ensure_tiny_model(tmp_path)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["num_key_value_heads"] < config["num_attention_heads"]  # GQA

    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    text = "The scheduler plans; it never touches tensors."
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text) / 2  # the BPE learned merges from the corpus

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    assert out.shape == (1, len(ids) + 8)
    assert len(set(out[0, len(ids) :].tolist())) > 1  # not a degenerate repeat-the-last-token


def test_model_sources():
    assert resolve_model_path(None).name.startswith("tokenspeed-tiny-")
    assert {"qwen3-8b", "qwen3-30b-a3b", "deepseek-v3", "kimi-k25", "gpt-oss-20b"} <= set(
        shipped_architectures()
    )
    cfg = json.loads((resolve_model_path("qwen3-8b") / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_key_value_heads"]) == (
        4096,
        36,
        8,
    )
    with pytest.raises(ConfigError, match="without weights"):
        resolve_model_path("qwen3-8b", load_format="auto")
    with pytest.raises(ConfigError, match="does not download"):
        resolve_model_path("/no/such/model")
