"""The FlashInfer peer's page lists (benchmarks only): the block table a sweep builds becomes
FlashInfer's ``indptr`` / ``indices`` / ``last_page_len`` with each request's used pages in
order, so the peer reads exactly the tokens our kernels read."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "kernels" / "flashinfer_gqa.py"


def _module():
    spec = importlib.util.spec_from_file_location("flashinfer_gqa", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_page_lists_take_each_requests_used_pages_in_order():
    tables = torch.tensor([[7, 3, 9, 1], [4, 8, 0, 0], [5, 0, 0, 0]], dtype=torch.int32)
    lens = torch.tensor([49, 16, 0], dtype=torch.int32)  # 4 pages (1 token in the last), 1, 0
    indptr, indices, last = _module().page_lists(tables, lens, 16)
    assert indptr.tolist() == [0, 4, 5, 5]
    assert indices.tolist() == [7, 3, 9, 1, 4]
    assert last.tolist() == [1, 16, 0]
    assert indices.dtype == last.dtype == indptr.dtype == torch.int32
