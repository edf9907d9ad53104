"""Tokenizers shipped as tiktoken BPE files (Kimi K2, Moonlight): converted to `tokenizers` and
checked token for token against tiktoken itself.

The test checkpoint is made here: a byte-level BPE trained on the tiny model's corpus, written
the way such checkpoints are (``tiktoken.model``, a ``tokenization_*.py`` declaring ``pat_str``,
``tokenizer_config.json`` naming the special tokens after the ranks).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenspeed.runtime.tiktoken_vocab import (
    TiktokenVocabError,
    byte_level_alphabet,
    load_tiktoken_dir,
)
from tokenspeed.runtime.tokenizer import Tokenizer

# Han runs, letters outside Han (a class intersection), contractions, 1-3 digits, punctuation,
# newlines, trailing whitespace: the features of the patterns such checkpoints declare.
PIECES = [
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{L}&&[^\p{Han}]]+(?i:'s|'t|'re|'ll)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
]
RESERVED = 4  # num_reserved_special_tokens: 4 + 2 special ids after the ranks
NAMED = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|tool_calls_section_begin|>"}
_PATTERN_LINES = "".join("            r'''" + p + "''',\n" for p in PIECES)
SOURCE = (
    "import tiktoken  # never imported by TokenSpeed: the pattern is read from this text\n\n\n"
    "class DemoTikTokenTokenizer:\n"
    '    vocab_files_names = {"vocab_file": "tiktoken.model"}\n'
    f"    num_reserved_special_tokens = {RESERVED}\n"
    '    pat_str = "|".join(\n        [\n' + _PATTERN_LINES + "        ]\n    )\n"
)


def trained_ranks(vocab_size: int = 900) -> dict[bytes, int]:
    """A BPE learned on the tiny corpus, as tiktoken ranks: the 256 bytes, then each merge."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    corpus = (Path(__file__).parents[3] / "runtime" / "tiny_model" / "corpus.txt").read_text()
    bpe = HFTokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([corpus], trainer)
    to_byte = {c: b for b, c in byte_level_alphabet().items()}
    ranks = {bytes([b]): b for b in range(256)}
    for merge in json.loads(bpe.to_str())["model"]["merges"]:
        left, right = merge if isinstance(merge, list) else merge.split(" ")
        token = bytes(to_byte[c] for c in left + right)
        ranks.setdefault(token, len(ranks))
    return ranks


def write_checkpoint(path: Path, ranks: dict[bytes, int], source: str = SOURCE) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    lines = [
        f"{base64.b64encode(t).decode()} {r}"
        for t, r in sorted(ranks.items(), key=lambda kv: kv[1])
    ]
    (path / "tiktoken.model").write_text("\n".join(lines) + "\n")
    (path / "tokenization_demo.py").write_text(source)
    base = len(ranks)
    config = {
        "auto_map": {"AutoTokenizer": ["tokenization_demo.DemoTikTokenTokenizer", None]},
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "added_tokens_decoder": {
            str(base + i): {"content": name, "special": True} for i, name in NAMED.items()
        },
        "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<|im_end|>"
        "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}",
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def ranks() -> dict[bytes, int]:
    return trained_ranks()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, ranks) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("kimi-like"), ranks)


@pytest.fixture(scope="module")
def reference(ranks) -> tiktoken.Encoding:
    base = len(ranks)
    names = [NAMED.get(i, f"<|reserved_token_{base + i}|>") for i in range(RESERVED + 2)]
    specials = {name: base + i for i, name in enumerate(names)}
    return tiktoken.Encoding("demo", pat_str="|".join(PIECES), mergeable_ranks=ranks,
                             special_tokens=specials)  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tokenizer]:
    with pytest.MonkeyPatch.context() as mp:  # the converted copy goes to a test folder
        mp.setenv("TOKENSPEED_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield Tokenizer.from_dir(checkpoint)


TEXT = st.lists(
    st.one_of(
        st.sampled_from(["the", " the", "ing", "'s", "'LL", "Hello", "中文", "漢字の", "ёж", "é"]),
        st.sampled_from(["1", "123", "45678", ".", ",", "!?", "-->", "🙂", "\t", " ", "  "]),
        st.sampled_from(
            ["\n", "\r\n", "\n\n", "[BOS]", "<|im_end|>", "<|tool_calls_section_begin|>"]
        ),
        st.text(max_size=6),
    ),
    max_size=24,
).map("".join)


@settings(max_examples=400, deadline=None)
@given(text=TEXT)
def test_encodes_as_tiktoken_does(tokenizer: Tokenizer, reference: tiktoken.Encoding, text: str):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids == reference.encode(text, allowed_special="all")
    assert tokenizer.decode(ids, skip_special_tokens=False) == reference.decode(ids)


def test_the_corpus_encodes_the_same(tokenizer: Tokenizer, reference: tiktoken.Encoding):
    corpus = (Path(__file__).parents[3] / "runtime" / "tiny_model" / "corpus.txt").read_text()
    assert tokenizer.encode(corpus, add_special_tokens=False) == reference.encode(corpus)


def test_special_tokens_and_chat(tokenizer: Tokenizer, ranks):
    base = len(ranks)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (base, base + 1)
    assert tokenizer.backend.token_to_id(f"<|reserved_token_{base + 5}|>") == base + 5
    assert tokenizer.backend.get_vocab_size(with_added_tokens=True) == base + RESERVED + 2
    ids = tokenizer.encode_chat([{"role": "user", "content": "Hi"}])
    assert base + 2 in ids  # <|im_end|> from the template is the special token
    assert tokenizer.decode(ids) == "user: Hiassistant: "  # special tokens skipped


def test_converted_once_then_cached(checkpoint: Path, tmp_path: Path, ranks):
    first = load_tiktoken_dir(checkpoint, cache_root=tmp_path)
    cached = list((tmp_path / "tokenizers").glob("tiktoken-*.json"))
    assert len(cached) == 1
    again = load_tiktoken_dir(checkpoint, cache_root=tmp_path)
    assert again.encode("Hello 123 中文").ids == first.encode("Hello 123 中文").ids
    # another pattern is another tokenizer: a new cache entry, not the old one reused
    other = write_checkpoint(tmp_path / "other", ranks, SOURCE.replace(r"\p{N}{1,3}", r"\p{N}"))
    changed = load_tiktoken_dir(other, cache_root=tmp_path)
    assert len(list((tmp_path / "tokenizers").glob("tiktoken-*.json"))) == 2
    assert len(changed.encode("12345").ids) == 5


def test_unreadable_checkpoints_are_one_clear_error(tmp_path: Path, ranks):
    no_pattern = write_checkpoint(tmp_path / "a", ranks, "class T:\n    pat_str = make()\n")
    with pytest.raises(TiktokenVocabError, match="pat_str"):
        load_tiktoken_dir(no_pattern, cache_root=tmp_path)
    bad_line = write_checkpoint(tmp_path / "b", ranks)
    with (bad_line / "tiktoken.model").open("a") as f:
        f.write("not-base64!! 7\n")
    with pytest.raises(TiktokenVocabError, match=r"tiktoken.model:\d+"):
        load_tiktoken_dir(bad_line, cache_root=tmp_path)
    no_source = write_checkpoint(tmp_path / "c", ranks)
    (no_source / "tokenization_demo.py").unlink()
    with pytest.raises(TiktokenVocabError, match="tokenization_"):
        load_tiktoken_dir(no_source, cache_root=tmp_path)


def test_structured_outputs_read_the_converted_vocabulary(checkpoint: Path, tokenizer: Tokenizer):
    torch = pytest.importorskip("torch")
    from tokenspeed.runtime.grammar.backend import GrammarBackend, fill_bitmasks
    from tokenspeed.runtime.grammar.spec import GrammarSpec

    vocab = tokenizer.backend.get_vocab_size(with_added_tokens=True)
    backend = GrammarBackend(checkpoint, vocab, [tokenizer.eos_token_id])
    g = backend.matcher(GrammarSpec.regex("[0-9]{3}"))
    mask = torch.full((1, (vocab + 31) // 32), -1, dtype=torch.int32)
    fill_bitmasks([g], mask)
    allowed = {t for t in range(vocab) if (int(mask[0, t // 32]) >> (t % 32)) & 1}
    texts = {tokenizer.decode([t]) for t in allowed}
    assert texts and all(t.isdigit() and len(t) <= 3 for t in texts)
    assert tokenizer.encode("7", add_special_tokens=False)[0] in allowed
