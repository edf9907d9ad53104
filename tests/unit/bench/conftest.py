"""Bench unit fixtures: the embedded tiny model's tokenizer and a word sampler over it."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from tokenspeed_cli.bench.tokens import TokenSampler, load_tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return load_tokenizer(None)


@pytest.fixture(scope="session")
def sampler(tokenizer: Tokenizer) -> TokenSampler:
    return TokenSampler(tokenizer)
