"""The embedded default model: a tiny Qwen3 checkpoint made on first use from a fixed seed.

It lets every command run on a laptop CPU with no download. The directory is a normal Hugging
Face layout (config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
generation_config.json) that `transformers` loads too. Weights come from numpy's PCG64 generator
and the byte-level BPE tokenizer is trained on `corpus.txt`, so the bytes are the same on every
machine; the folder name carries a digest of the recipe so a changed recipe makes a new folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

TINY_MODEL_NAME = "tokenspeed-tiny"
SEED = 20261129
VOCAB_SIZE = 1024
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# Small enough to run a step in about a millisecond on one CPU core, big enough to have GQA,
# several layers and pages worth of context.
TINY_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 4,
    "initializer_range": 0.02,
    "torch_dtype": "float32",
    "use_cache": True,
}

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' and message.get('tool_calls') %}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') }}"
    "{%- for call in message['tool_calls'] %}"
    "{{- '\\n<tool_call>' + (call['function'] | tojson) + '</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def default_cache_root() -> Path:
    """`$TOKENSPEED_CACHE_DIR`, else `~/.cache/tokenspeed`."""
    env = os.environ.get("TOKENSPEED_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "tokenspeed"


def _corpus_path() -> Path:
    return Path(__file__).with_name("corpus.txt")


def recipe_digest() -> str:
    """A digest of everything that determines the model's bytes."""
    h = hashlib.sha256()
    h.update(
        json.dumps(
            [TINY_CONFIG, SEED, VOCAB_SIZE, SPECIAL_TOKENS, CHAT_TEMPLATE], sort_keys=True
        ).encode()
    )
    h.update(_corpus_path().read_bytes())
    return h.hexdigest()[:12]


def train_tokenizer() -> Any:
    """Byte-level BPE trained on the shipped corpus (deterministic for a given corpus)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus_path().read_text().splitlines(keepends=True), trainer)
    return tokenizer


def make_weights(config: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    """Random float32 weights in the Qwen3 Hugging Face naming, from a fixed seed."""
    rng = np.random.Generator(np.random.PCG64(seed))
    std = config["initializer_range"]
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads, head_dim = (
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
    )

    def normal(*shape: int, scale: float = std) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    weights = {"model.embed_tokens.weight": normal(config["vocab_size"], hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights[p + "self_attn.q_proj.weight"] = normal(heads * head_dim, hidden)
        weights[p + "self_attn.k_proj.weight"] = normal(kv_heads * head_dim, hidden)
        weights[p + "self_attn.v_proj.weight"] = normal(kv_heads * head_dim, hidden)
        weights[p + "self_attn.o_proj.weight"] = normal(hidden, heads * head_dim)
        weights[p + "self_attn.q_norm.weight"] = np.ones(head_dim, np.float32)
        weights[p + "self_attn.k_norm.weight"] = np.ones(head_dim, np.float32)
        weights[p + "mlp.gate_proj.weight"] = normal(inter, hidden)
        weights[p + "mlp.up_proj.weight"] = normal(inter, hidden)
        weights[p + "mlp.down_proj.weight"] = normal(hidden, inter)
        weights[p + "input_layernorm.weight"] = np.ones(hidden, np.float32)
        weights[p + "post_attention_layernorm.weight"] = np.ones(hidden, np.float32)
    weights["model.norm.weight"] = np.ones(hidden, np.float32)
    if not config["tie_word_embeddings"]:
        # An untied, wider head gives peaked, varied next-token distributions (a tied head
        # would mostly repeat the last token), which makes sampling and stop tests meaningful.
        weights["lm_head.weight"] = normal(config["vocab_size"], hidden, scale=0.15)
    return weights


def write_tiny_model(directory: Path) -> None:
    """Write the complete Hugging Face layout into `directory` (which must exist)."""
    from safetensors.numpy import save_file

    tokenizer = train_tokenizer()
    special = {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}
    config = dict(TINY_CONFIG)
    # Round the embedding table up to a multiple of 64, as real checkpoints do.
    config["vocab_size"] = -(-tokenizer.get_vocab_size() // 64) * 64
    config["bos_token_id"] = special["<|endoftext|>"]
    config["eos_token_id"] = special["<|im_end|>"]
    config["pad_token_id"] = special["<|endoftext|>"]

    tokenizer.save(str(directory / "tokenizer.json"))
    save_file(
        make_weights(config, SEED), str(directory / "model.safetensors"), metadata={"format": "pt"}
    )
    _write_json(directory / "config.json", config)
    _write_json(
        directory / "generation_config.json",
        {
            "bos_token_id": config["bos_token_id"],
            "eos_token_id": [special["<|im_end|>"], special["<|endoftext|>"]],
            "pad_token_id": config["pad_token_id"],
        },
    )
    _write_json(
        directory / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "add_bos_token": False,
            "add_eos_token": False,
            "model_max_length": config["max_position_embeddings"],
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        },
    )


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def ensure_tiny_model(cache_root: Path | None = None) -> Path:
    """The tiny model's directory, written on first use.

    Safe when several processes race: each writes into a private temporary folder and renames
    it into place; the loser's rename fails and its copy is discarded.
    """
    root = cache_root or default_cache_root()
    target = root / "models" / f"{TINY_MODEL_NAME}-{recipe_digest()}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".tiny-", dir=target.parent))
    try:
        write_tiny_model(scratch)
        try:
            scratch.rename(target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)
    return target
