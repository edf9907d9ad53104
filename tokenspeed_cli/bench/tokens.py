"""Token-exact prompt text: the benchmark's tokenizer and a sampler of words.

Prompts go to the server as text (any OpenAI-compatible endpoint accepts text), yet their
lengths must be exact in tokens. `TokenSampler` picks vocabulary entries that are whole
space-led words and encode back to exactly one token each; joined, they form text whose token
count is known by construction (checked, and repaired when a tokenizer does not split that way).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from tokenspeed_cli.bench.errors import BenchError


def load_tokenizer(path: str | Path | None) -> Tokenizer:
    """The tokenizer prompts are built and counted with.

    ``path`` is a model or tokenizer directory or a ``tokenizer.json``; ``None`` means the
    embedded tiny model's tokenizer (made on first use, no download).
    """
    if path is None:
        from tokenspeed.runtime.model_source import resolve_model_path

        path = resolve_model_path(None)
    p = Path(path).expanduser()
    if p.is_dir():  # tokenizer.json, or a tiktoken BPE (Kimi) converted to one
        from tokenspeed.runtime.tokenizer import TokenizerNotFound, load_backend

        try:
            return load_backend(p)
        except TokenizerNotFound:
            raise BenchError(f"no tokenizer.json (nor tiktoken.model) in {p}") from None
        except Exception as e:  # the tokenizers library raises plain Exceptions on bad files
            raise BenchError(f"cannot load tokenizer in {p}: {e}") from None
    if not p.is_file():
        raise BenchError(f"no tokenizer at {p} (--tokenizer takes a directory or the file)")
    try:
        return Tokenizer.from_file(str(p))
    except Exception as e:  # the tokenizers library raises plain Exceptions on bad files
        raise BenchError(f"cannot load tokenizer {p}: {e}") from None


def count_tokens(tokenizer: Tokenizer, text: str) -> int:
    """Tokens in ``text`` without special tokens (the server adds its own, if any)."""
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


class TokenSampler:
    """Random text of an exact token length under one tokenizer."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.words = self._single_token_words(tokenizer)
        if len(self.words) < 8:
            raise BenchError("the tokenizer has too few plain-word tokens to build prompts from")

    @staticmethod
    def _single_token_words(tok: Tokenizer) -> list[str]:
        """Space-led alphabetic vocabulary entries that re-encode to exactly one token."""
        words: list[str] = []
        for token_id in range(tok.get_vocab_size()):
            text = tok.decode([token_id], skip_special_tokens=True)
            body = text[1:]
            if not (text.startswith(" ") and len(body) >= 2 and body.isascii() and body.isalpha()):
                continue
            if tok.encode(text, add_special_tokens=False).ids == [token_id]:
                words.append(text)
        if len(words) < 8:  # tokenizers that decode without the leading space (SentencePiece)
            seen: set[str] = set()
            for token_id in range(tok.get_vocab_size()):
                body = tok.decode([token_id], skip_special_tokens=True).strip()
                if len(body) >= 2 and body.isascii() and body.isalpha() and body not in seen:
                    seen.add(body)
                    words.append(" " + body)
        return words

    def text(self, num_tokens: int, rng: np.random.Generator) -> str:
        """Text that encodes to exactly ``num_tokens`` tokens (best effort for odd tokenizers)."""
        if num_tokens <= 0:
            return ""
        picks = [self.words[i] for i in rng.integers(0, len(self.words), size=num_tokens)]
        for _ in range(64):
            text = "".join(picks)
            have = count_tokens(self.tokenizer, text)
            if have == num_tokens:
                return text
            if have > num_tokens:
                picks = picks[: max(1, len(picks) - (have - num_tokens))]
            else:
                extra = rng.integers(0, len(self.words), size=num_tokens - have)
                picks += [self.words[i] for i in extra]
        return "".join(picks)
