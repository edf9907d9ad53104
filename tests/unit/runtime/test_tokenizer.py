"""The runtime tokenizer agrees with transformers' tokenizer on ids, text and chat prompts."""

from __future__ import annotations

import json

import pytest

from tokenspeed.runtime.model_source import resolve_model_path
from tokenspeed.runtime.tokenizer import Tokenizer, TokenizerNotFound

TEXTS = ["Hello world, this is a test.", "  spaces\tand\nnewlines ", "ünïcödé ✓ 你好", ""]
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another?"},
]


@pytest.fixture(scope="module")
def tiny_dir():
    return resolve_model_path(None)


def test_encode_decode_and_chat_match_transformers(tiny_dir):
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(tiny_dir)
    ours = Tokenizer.from_dir(tiny_dir)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == ref.encode(text)
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)
    for gen in (True, False):
        expected = ref.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=gen)
        assert ours.apply_chat_template(CONVERSATION, add_generation_prompt=gen) == expected
    assert ours.encode_chat(CONVERSATION) == ours.encode(
        ref.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    )
    assert ours.eos_token_id == ref.eos_token_id


def test_bos_is_added_when_configured(tiny_dir, tmp_path):
    for name in ("tokenizer.json",):
        (tmp_path / name).write_bytes((tiny_dir / name).read_bytes())
    cfg = json.loads((tiny_dir / "tokenizer_config.json").read_text())
    cfg.update(bos_token="<|endoftext|>", add_bos_token=True)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = Tokenizer.from_dir(tmp_path)
    ids = tok.encode("hello")
    assert ids[0] == tok.bos_token_id and ids[1:] == Tokenizer.from_dir(tiny_dir).encode("hello")
    assert tok.encode("hello", add_special_tokens=False) == ids[1:]


def test_template_errors_and_missing_tokenizer(tiny_dir, tmp_path):
    with pytest.raises(TokenizerNotFound):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_bytes((tiny_dir / "tokenizer.json").read_bytes())
    no_template = Tokenizer.from_dir(tmp_path)
    with pytest.raises(ValueError, match="no chat template"):
        no_template.apply_chat_template(CONVERSATION)
    strict = Tokenizer.from_dir(tmp_path, chat_template="{{ raise_exception('only user turns') }}")
    with pytest.raises(ValueError, match="only user turns"):
        strict.apply_chat_template(CONVERSATION)
