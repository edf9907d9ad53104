"""The CPU float32 attention candidates against float64 math and the references.

Decode: ragged GQA batches, junk block-table entries, empty requests, no V read past a request,
the per-step plan and its cache.
Extend: cached prefixes (end-aligned causal masks), causal and not, GQA groups.
"""

from __future__ import annotations

import kernel_float64_math as f64
import pytest
import torch
from kernel_cases import paged_kv

import tokenspeed.kernels as K
from tokenspeed.kernels import selection_records
from tokenspeed.kernels.reference import attention as ref_attn
from tokenspeed.kernels.torch_ops import cpu_paged_decode as cpu
from tokenspeed.kernels.torch_ops import cpu_paged_extend


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual.double(), expected.double(), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("page_size", [1, 4, 16, 32])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_matches_float64_on_ragged_gqa_batches(page_size, group):
    # Lengths around page boundaries, an empty request, one long one.
    seq_lens = [1, 63, 64, 65, 0, 130, 17]
    k_cache, v_cache, tables, lens = paged_kv(
        seq_lens, 2, 16, page_size, torch.float32, v_head_dim=8
    )
    qkv = torch.randn(len(seq_lens), 3 * 2 * group, 16)
    q = qkv[:, : 2 * group]  # non-contiguous, as the model passes it
    out = cpu.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.3)
    assert out.shape == (len(seq_lens), 2 * group, 8) and out.dtype == torch.float32
    close(out, f64.decode(q, k_cache, v_cache, tables, lens, 0.3))
    assert torch.all(out[4] == 0)  # an empty request reads nothing


@pytest.mark.parametrize("group", [1, 2, 4])
def test_matches_the_reference_at_model_shapes(group):
    """A tiny-model-sized batch: 64 requests up to 640 tokens, pages of 16, shuffled pages."""
    gen = torch.Generator().manual_seed(10 + group)
    seq_lens = torch.randint(1, 641, (64,), generator=gen).tolist()
    k_cache, v_cache, tables, lens = paged_kv(seq_lens, 2, 32, 16, torch.float32, seed=group)
    q = torch.randn(64, 2 * group, 32, generator=gen)
    out = cpu.paged_decode_attention(q, k_cache, v_cache, tables, lens, 32**-0.5)
    want = f64.decode_dense(q, k_cache, v_cache, tables, lens, 32**-0.5)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    ref = ref_attn.paged_decode_attention(q, k_cache, v_cache, tables, lens, 32**-0.5)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)


def test_never_reads_v_past_a_requests_length():
    """V rows past ``seq_len`` (the rest of the last page, junk pages) are never read.

    (K there is read and masked with -inf, as in the reference: it must be finite.)
    """
    seq_lens = [5, 20, 0, 33]
    k_cache, v_cache, tables, lens = paged_kv(seq_lens, 2, 16, 16, torch.float32)
    clean = v_cache.clone()
    live = torch.zeros(v_cache.shape[:2], dtype=torch.bool)
    for b, n in enumerate(seq_lens):
        for p in range(n):
            live[tables[b, p // 16], p % 16] = True
    v_cache[~live] = float("nan")
    q = torch.randn(4, 4, 16)
    out = cpu.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.25)
    assert torch.isfinite(out).all()
    close(out, f64.decode(q, k_cache, clean, tables, lens, 0.25))


def test_plan_covers_exactly_the_live_tokens():
    seq_lens = [5, 0, 70, 17]
    _, _, tables, lens = paged_kv(seq_lens, 2, 8, 4, torch.float32)
    plan = cpu.build_plan(tables, lens, num_pages=64, page_size=4, num_kv_heads=2, group=2)
    assert plan.chunk_tokens == cpu.CHUNK_TOKENS  # 16 pages of 4 tokens per chunk
    # Only chunks holding live tokens, request-major; visible positions = the live tokens.
    assert plan.owner.tolist() == [0, 2, 2, 3]
    visible = (plan.bias == 0).flatten(1).sum(1)
    assert visible.tolist() == [5, 64, 6, 17]
    # A chunk's pages are its request's table entries, in order (junk clamped into the pool).
    assert plan.pages[16:32].tolist() == tables[2, :16].tolist()
    # V rows: request 0, query head 3 (KV head 1): slot * Hk + 1, then its first row.
    row = plan.v_rows[0 * 4 + 3]
    slots = [int(tables[0, p // 4]) * 4 + p % 4 for p in range(5)]
    assert row[:5].tolist() == [slot * 2 + 1 for slot in slots]
    assert bool((row[5:] == row[0]).all())
    assert plan.empty is not None and plan.empty.flatten().tolist() == [False, True, False, False]


def test_plan_is_rebuilt_when_tables_or_lengths_change_in_place():
    """The per-step plan is reused across layers, but keyed on values, not on the tensors."""
    seq_lens = [10, 40, 3]
    k_cache, v_cache, tables, lens = paged_kv(seq_lens, 1, 8, 4, torch.float32)
    q = torch.randn(3, 2, 8)
    first = cpu.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.5)
    again = cpu.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.5)
    assert torch.equal(first, again)
    lens[0] = 7  # same tensor objects, new values (a refilled step buffer)
    tables[1, 0], tables[1, 1] = tables[1, 1].item(), tables[1, 0].item()
    out = cpu.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.5)
    close(out, f64.decode(q, k_cache, v_cache, tables, lens, 0.5))


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_extend_matches_float64_with_cached_prefixes(page_size, group, causal):
    q_lens, seq_lens = [3, 1, 6, 0, 20], [10, 1, 6, 4, 20]  # cached prefixes 7, 0, 0, 4, 0
    k_cache, v_cache, tables, lens = paged_kv(
        seq_lens, 2, 16, page_size, torch.float32, v_head_dim=8
    )
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    qkv = torch.randn(sum(q_lens), 3 * 2 * group, 16)
    q = qkv[:, : 2 * group]  # non-contiguous, as the model passes it
    out = cpu_paged_extend.paged_extend_attention(
        q, k_cache, v_cache, tables, cu, lens, 0.25, causal
    )
    assert out.shape == (sum(q_lens), 2 * group, 8) and out.dtype == torch.float32
    close(out, f64.extend(q, k_cache, v_cache, tables, cu, lens, 0.25, causal))


def test_extend_matches_the_reference_at_model_shapes():
    gen = torch.Generator().manual_seed(3)
    q_lens = [40, 1, 0, 200, 17, 33, 512]
    seq_lens = [40, 130, 9, 200, 100, 33, 512]  # cached prefixes 0, 129, 9, 0, 83, 0, 0
    k_cache, v_cache, tables, lens = paged_kv(seq_lens, 2, 32, 16, torch.float32)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(q_lens), 4, 32, generator=gen)
    out = cpu_paged_extend.paged_extend_attention(q, k_cache, v_cache, tables, cu, lens, 0.2)
    want = f64.extend_dense(q, k_cache, v_cache, tables, cu, lens, 0.2, True)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    ref = ref_attn.paged_extend_attention(q, k_cache, v_cache, tables, cu, lens, 0.2)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)


def test_the_ops_run_them_on_cpu_float32_only():
    for dtype in (torch.float32, torch.bfloat16):
        k_cache, v_cache, tables, lens = paged_kv([3, 9], 2, 16, 4, dtype)
        q = torch.randn(2, 4, 16).to(dtype)
        assert K.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.3).dtype == dtype
        cu = torch.tensor([0, 1, 2], dtype=torch.int32)
        out = K.paged_extend_attention(q, k_cache, v_cache, tables, cu, lens, 0.3)
        assert out.dtype == dtype
    used = {
        (r["op"], r["bucket"].split("|")[0]): r["kernel"]
        for r in selection_records()
        if r["op"].startswith("attention.")
    }
    f32, bf16 = "kv_cache=float32,q=float32", "kv_cache=bfloat16,q=bfloat16"
    assert used == {
        ("attention.decode", f32): "cpu_paged_decode",
        ("attention.decode", bf16): "torch_paged_decode",
        ("attention.extend", f32): "cpu_paged_extend",
        ("attention.extend", bf16): "torch_paged_extend",
    }
