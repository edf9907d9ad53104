"""What a captured decode graph reads: static metadata buffers each replay rewrites.

No CUDA here, so the buffers are checked directly: the views a capture hands the model must
show, after any replay's copy, exactly what the eager path computes for that batch.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from tokenspeed.runtime.kv_pool import MLALayout, make_kv_pool
from tokenspeed.runtime.layers.attention.mla_backend import MLAAttentionBackend

Q_LEN, BS, PAGES = 3, 12, 4  # verify graph of 4 requests x 3 rows


def _capture_batch(backend: MLAAttentionBackend, bs: int, q_len: int) -> SimpleNamespace:
    batch = SimpleNamespace(batch_size=bs, cu_seqlens_q=None, extras={"decode_q_len": q_len})
    backend.init_forward_metadata_capture_cuda_graph(batch)
    return batch


def test_verify_graph_reads_each_replays_requests():
    layout = MLALayout(num_layers=1, kv_lora_rank=8, rope_dim=4, page_size=4, dtype=torch.float32)
    pool = make_kv_pool(layout, num_pages=16, device=torch.device("cpu"))
    backend = MLAAttentionBackend(pool)
    backend.init_cuda_graph_state(BS, PAGES)
    batch = _capture_batch(backend, BS, Q_LEN)
    tables, lens = batch.extras["mla_requests"]
    for seq in ([9, 5], [14, 7, 3]):  # two replays: the second overwrites the first
        n = len(seq)
        rows = torch.tensor(seq, dtype=torch.int32).repeat_interleave(Q_LEN)
        rows += torch.arange(n * Q_LEN, dtype=torch.int32) % Q_LEN - (Q_LEN - 1)
        req_tables = torch.arange(n * 2, dtype=torch.int32).view(n, 2)
        backend.init_forward_metadata_replay_cuda_graph(
            BS, req_tables.repeat_interleave(Q_LEN, 0), rows, q_len=Q_LEN
        )
        assert lens.tolist() == [*seq, *[Q_LEN] * (BS // Q_LEN - n)]  # padding: q_len tokens
        assert torch.equal(tables[:n, :2], req_tables)
        assert (tables[n:] == pool.scratch_page).all()  # padded requests read the scratch page


def test_plain_graph_keeps_one_row_per_request():
    layout = MLALayout(num_layers=1, kv_lora_rank=8, rope_dim=4, page_size=4, dtype=torch.float32)
    backend = MLAAttentionBackend(make_kv_pool(layout, num_pages=16, device=torch.device("cpu")))
    backend.init_cuda_graph_state(BS, PAGES)
    batch = _capture_batch(backend, 4, 1)
    assert "mla_requests" not in batch.extras
    backend.init_forward_metadata_replay_cuda_graph(4, torch.zeros(2, 1, dtype=torch.int32),
                                                    torch.tensor([5, 6], dtype=torch.int32))  # fmt: skip
    assert batch.seq_lens.tolist() == [5, 6, 1, 1]
