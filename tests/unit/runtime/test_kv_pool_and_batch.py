"""KV pool sizing and page copies; forward-op -> tensor conversion against naive loops."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from runtime_helpers import Op

from tokenspeed.runtime.forward_batch import ForwardMode, make_forward_batch
from tokenspeed.runtime.kv_pool import (
    HostKVPool,
    KVLayout,
    PagedKVPool,
    load_back,
    pages_for_budget,
    write_back,
)

LAYOUT = KVLayout(
    num_layers=2, num_kv_heads=2, head_dim=8, v_head_dim=8, page_size=4, dtype=torch.float32
)


def test_sizing():
    assert LAYOUT.bytes_per_page == 2 * 2 * (8 + 8) * 4 * 4
    assert pages_for_budget(LAYOUT, 10, None) == 3  # tokens win, rounded up to pages
    assert pages_for_budget(LAYOUT, None, LAYOUT.bytes_per_page * 7 + 5) == 7
    with pytest.raises(ValueError, match="holds no page"):
        pages_for_budget(LAYOUT, None, 10)


def test_write_back_then_load_back_round_trips():
    dev = PagedKVPool(LAYOUT, 6, torch.device("cpu"))
    host = HostKVPool(LAYOUT, 4, pin=False)
    for i, (k, v) in enumerate(zip(dev.k_buffers, dev.v_buffers, strict=True)):
        k.copy_(torch.randn_like(k) + i)
        v.copy_(torch.randn_like(v) - i)
    before = [t.clone() for t in dev.k_buffers + dev.v_buffers]
    write_back(dev, host, np.array([4, 1], np.int32), np.array([0, 3], np.int32))
    for t in dev.k_buffers + dev.v_buffers:
        t.zero_()
    load_back(host, dev, [3, 0], [2, 5])  # page 1 -> host 3 -> device 2; page 4 -> host 0 -> 5
    for got, want in zip(dev.k_buffers + dev.v_buffers, before, strict=True):
        torch.testing.assert_close(got[2], want[1])
        torch.testing.assert_close(got[5], want[4])
        assert got[0].abs().sum() == 0
    assert dev.scratch_page == 6 and dev.k_buffers[0].shape[0] == 7


def test_forward_batch_matches_naive_construction():
    rng = np.random.default_rng(0)
    page = 4
    prefix = np.array([0, 5, 9, 3], np.int32)
    extend = np.array([7, 1, 3, 1], np.int32)
    seq = prefix + extend
    max_pages = int(-(-seq.max() // page))
    tables = rng.permutation(64)[: 4 * max_pages].reshape(4, max_pages).astype(np.int32)
    ids = rng.integers(0, 100, int(extend.sum())).astype(np.int32)
    op = Op(
        ForwardMode.MIXED,
        ["a", "b", "c", "d"],
        np.array([3, 0, 2, 1]),
        prefix,
        extend,
        seq,
        ids,
        tables,
        np.array([True, True, False, True]),
    )
    batch = make_forward_batch(op, page, torch.device("cpu"))
    positions, slots, sample_idx = [], [], []
    t = 0
    for b in range(4):
        for j in range(extend[b]):
            pos = prefix[b] + j
            positions.append(pos)
            slots.append(tables[b, pos // page] * page + pos % page)
            t += 1
        if op.sample_mask[b]:
            sample_idx.append(t - 1)
    assert batch.positions.tolist() == positions
    assert batch.slot_mapping.tolist() == slots
    assert batch.sample_indices.tolist() == sample_idx
    assert batch.cu_seqlens_q.tolist() == [0, 7, 8, 11, 12]
    assert batch.sample_rows_np.tolist() == [0, 1, 3]
    assert batch.mode is ForwardMode.MIXED and batch.num_tokens == 12


def test_mode_from_foreign_enum():
    class Foreign:
        name = "DECODE"

    assert ForwardMode.of(Foreign()) is ForwardMode.DECODE
    assert ForwardMode.of("ForwardMode.EXTEND") is ForwardMode.EXTEND
