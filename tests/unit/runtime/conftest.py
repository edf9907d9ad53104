"""Fixtures: tiny transformers checkpoints and their greedy references, made once per session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from runtime_helpers import (  # noqa: E402
    KINDS,
    NUM_NEW,
    hf_greedy,
    hf_model,
    make_prompts,
    make_tiny_checkpoint,
)


@pytest.fixture(scope="session", autouse=True)
def _threads() -> None:
    torch.set_num_threads(2)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    return {kind: make_tiny_checkpoint(kind, root / kind) for kind in KINDS}


@pytest.fixture(scope="session")
def prompts() -> list[list[int]]:
    return make_prompts()


@pytest.fixture(scope="session")
def references(checkpoints: dict[str, Path], prompts: list[list[int]]) -> dict[str, tuple]:
    """transformers' greedy tokens and per-step logits for every checkpoint."""
    return {kind: hf_greedy(hf_model(path), prompts, NUM_NEW) for kind, path in checkpoints.items()}
