"""Tokenizers shipped as a tiktoken BPE file (Kimi K2, Moonlight), read by the ``tokenizers``
library.

Such checkpoints carry ``tiktoken.model`` (one ``<base64 token bytes> <rank>`` line per token),
the pre-tokenizer pattern as a class attribute ``pat_str`` of their ``tokenization_*.py``, and
their special tokens in ``tokenizer_config.json`` (``added_tokens_decoder``), with ids right after
the BPE ranks. Nothing of the checkpoint's Python runs: the pattern is read from the source
with ``ast``. The BPE becomes a byte-level ``tokenizers`` model whose merge order is the rank
order: merging the pair whose joined token has the lowest rank is exactly tiktoken's rule, so
encoding matches token for token. Converted tokenizers are cached as ``tokenizer.json`` under
the TokenSpeed cache folder, keyed by the digest of what they were made from.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

TIKTOKEN_FILE = "tiktoken.model"
_DEFAULT_RESERVED = 256  # special-token ids after the ranks (Kimi's num_reserved_special_tokens)


class TiktokenVocabError(ValueError):
    """The directory's tiktoken tokenizer cannot be read (with the reason)."""


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte, the alphabet of byte-level BPE vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def read_ranks(path: Path) -> dict[bytes, int]:
    """``tiktoken.model``: token bytes -> rank."""
    ranks: dict[bytes, int] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError as exc:
            raise TiktokenVocabError(f"{path}:{n}: not '<base64> <rank>' ({exc})") from None
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise TiktokenVocabError(f"{path}: ranks are not 0..{len(ranks) - 1}, each once")
    return ranks


def _class_attributes(source: str) -> dict[str, Any]:
    """Literal class attributes of a tokenizer module (``pat_str``, the reserved count): string
    literals, ``"|".join([...literals...])`` and integers."""
    found: dict[str, Any] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        for stmt in node.body:
            target, value = None, None
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target, value = stmt.targets[0], stmt.value
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                target, value = stmt.target, stmt.value
            if not isinstance(target, ast.Name) or value is None:
                continue
            literal = _literal(value)
            if literal is not None:
                found.setdefault(target.id, literal)
    return found


def _literal(value: ast.expr) -> Any:
    if isinstance(value, ast.Constant) and isinstance(value.value, str | int):
        return value.value
    is_join = (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr == "join"
        and isinstance(value.func.value, ast.Constant)
        and isinstance(value.func.value.value, str)
        and len(value.args) == 1
        and isinstance(value.args[0], ast.List | ast.Tuple)
    )
    if not is_join:
        return None
    parts = [_literal(e) for e in value.args[0].elts]  # type: ignore[attr-defined]
    if not all(isinstance(p, str) for p in parts):
        return None
    return value.func.value.value.join(parts)  # type: ignore[attr-defined]


def tokenizer_source(path: Path, config: dict[str, Any]) -> Path:
    """The ``tokenization_*.py`` that ``tokenizer_config.json`` names (``auto_map``), else the
    only one in the directory."""
    auto = (config.get("auto_map") or {}).get("AutoTokenizer")
    names = [auto] if isinstance(auto, str) else list(auto or [])
    for name in names:
        if isinstance(name, str) and "." in name:
            candidate = path / (name.split("--")[-1].rsplit(".", 1)[0] + ".py")
            if candidate.is_file():
                return candidate
    found = sorted(path.glob("tokenization_*.py"))
    if len(found) == 1:
        return found[0]
    raise TiktokenVocabError(
        f"{path} has {TIKTOKEN_FILE} but no single tokenization_*.py declaring its pattern"
    )


def special_tokens(config: dict[str, Any], first_id: int, count: int) -> dict[int, str]:
    """Ids ``first_id .. first_id + count - 1``: the names in ``added_tokens_decoder``, and
    ``<|reserved_token_ID|>`` for the rest (the convention of these tokenizers)."""
    named = {
        int(i): (t.get("content") if isinstance(t, dict) else str(t))
        for i, t in (config.get("added_tokens_decoder") or {}).items()
    }
    ids = set(range(first_id, first_id + count)) | {i for i in named if i >= first_id}
    return {i: named.get(i) or f"<|reserved_token_{i}|>" for i in sorted(ids)}


def build_tokenizer(ranks: dict[bytes, int], pattern: str, specials: dict[int, str]) -> HFTokenizer:
    """A byte-level BPE ``tokenizers`` model that encodes as tiktoken does with ``ranks``."""
    alphabet = byte_level_alphabet()

    def text(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges: list[tuple[int, int, int, str, str]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = ranks.get(token[:cut]), ranks.get(token[cut:])
            if left is not None and right is not None:
                merges.append((rank, left, right, text(token[:cut]), text(token[cut:])))
    merges.sort()
    bpe = models.BPE(vocab, [(m[3], m[4]) for m in merges], fuse_unk=False)
    tokenizer = HFTokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    # ids must follow the ranks: add them in id order, one by one, checking each lands there
    for token_id, content in sorted(specials.items()):
        if tokenizer.get_vocab_size(with_added_tokens=True) != token_id:
            raise TiktokenVocabError(f"special token ids leave a gap before {token_id}")
        tokenizer.add_special_tokens([AddedToken(content, special=True, normalized=False)])
    return tokenizer


def load_tiktoken_dir(path: Path, cache_root: Path | None = None) -> HFTokenizer:
    """The directory's tiktoken tokenizer as a ``tokenizers`` one (converted once, cached)."""
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    source = tokenizer_source(path, config)
    attrs = _class_attributes(source.read_text())
    pattern = attrs.get("pat_str")
    if not isinstance(pattern, str):
        raise TiktokenVocabError(f"{source} declares no literal pat_str pattern")
    reserved = attrs.get("num_reserved_special_tokens", _DEFAULT_RESERVED)
    vocab_file = path / TIKTOKEN_FILE
    digest = hashlib.sha256()
    for part in (vocab_file.read_bytes(), pattern.encode(), config_file.read_bytes() if
                 config_file.is_file() else b"", str(reserved).encode()):  # fmt: skip
        digest.update(hashlib.sha256(part).digest())
    cache = _cache_root(cache_root) / f"tiktoken-{digest.hexdigest()[:24]}.json"
    if cache.is_file():
        return HFTokenizer.from_file(str(cache))
    ranks = read_ranks(vocab_file)
    # Kimi reserves num_reserved_special_tokens + 2 ids after the ranks
    tokenizer = build_tokenizer(ranks, pattern, special_tokens(config, len(ranks), reserved + 2))
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
        tokenizer.save(str(tmp))
        tmp.replace(cache)
    except OSError:  # a read-only cache: convert again next time
        pass
    return tokenizer


def _cache_root(cache_root: Path | None) -> Path:
    from tokenspeed.runtime.tiny_model import default_cache_root

    return (cache_root or default_cache_root()) / "tokenizers"
