"""The torch references of ``tokenspeed.mla`` against independent float64 math."""

from __future__ import annotations

import pytest
import torch
from mla_float64 import cu, decode64, paged_latent, prefill64

from tokenspeed.mla import reference as R


@pytest.mark.parametrize("q_len", [1, 2, 4])
@pytest.mark.parametrize("page_size", [1, 16])
def test_decode_reference(q_len, page_size):
    seq = [5, 33, q_len]
    rank, dim, heads = 32, 48, 4
    cache, tables = paged_latent(seq, page_size, dim, torch.float32, seed=q_len)
    q = torch.randn(len(seq), q_len, heads, dim)
    out, lse = R.mla_decode(
        q, cache, tables, torch.tensor(seq, dtype=torch.int32), 0.3, return_lse=True,
        kv_lora_rank=rank,
    )  # fmt: skip
    exp, exp_lse = decode64(q, cache, tables, seq, 0.3, rank)
    torch.testing.assert_close(out.double(), exp, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.double(), exp_lse, atol=2e-5, rtol=2e-5)


def test_decode_reference_empty_request_and_fp8_scales():
    seq = [0, 20]
    cache, tables = paged_latent(seq, 4, 24, torch.float32)
    per_token = torch.rand(cache.shape[0], 4) + 0.5
    fp8 = cache.to(torch.float8_e4m3fn)
    q = torch.randn(2, 1, 3, 24)
    out, lse = R.mla_decode(
        q, fp8, tables, torch.tensor(seq, dtype=torch.int32), 0.5, return_lse=True,
        kv_scale=per_token, kv_lora_rank=16,
    )  # fmt: skip
    exp, exp_lse = decode64(q, fp8.float(), tables, seq, 0.5, 16, kv_scale=per_token)
    assert torch.all(out[0] == 0) and torch.all(lse[0] == float("-inf"))
    torch.testing.assert_close(out.double(), exp, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse[1].double(), exp_lse[1], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_prefill_reference(causal):
    q_lens, kv_lens = [3, 17, 1], [3, 40, 9]  # prefixes of 0, 23 and 8 tokens
    q = torch.randn(sum(q_lens), 4, 24)
    k = torch.randn(sum(kv_lens), 2, 24)
    v = torch.randn(sum(kv_lens), 2, 16)
    out, lse = R.mla_prefill(
        q, k, v, cu(q_lens), cu(kv_lens), softmax_scale=0.2, causal=causal, return_lse=True
    )
    exp, exp_lse = prefill64(q, k, v, q_lens, kv_lens, 0.2, causal)
    torch.testing.assert_close(out.double(), exp, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.double(), exp_lse, atol=2e-5, rtol=2e-5)


def test_pack_and_fp8_round_trip_bounds():
    kv_c, k_pe = torch.randn(9, 64) * 3, torch.randn(9, 16)
    packed = R.mla_kv_pack(kv_c, k_pe)
    assert torch.equal(packed, torch.cat((kv_c, k_pe), -1))
    q, scale = R.mla_kv_pack_quantize_fp8(kv_c, k_pe)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (9,)
    deq = q.float() * scale[:, None]
    # e4m3: 3 mantissa bits -> relative error <= 2^-4; subnormals: absolute <= scale * 2^-10.
    bound = packed.abs() * 2**-4 + scale[:, None] * 2**-10
    assert torch.all((deq - packed).abs() <= bound)
    static = torch.tensor([0.05])
    q2, s2 = R.mla_kv_pack_quantize_fp8(kv_c, k_pe, scale=static)
    assert s2 is static
    expect = (packed / 0.05).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(q2.float(), expect.float())


def test_store_reference_skips_padding_and_writes_scales():
    cache = torch.zeros(3, 4, 20, dtype=torch.float8_e4m3fn)
    scales = torch.full((3, 4), -1.0)
    kv_c, k_pe = torch.randn(3, 16), torch.randn(3, 4)
    R.mla_store_kv(kv_c, k_pe, cache, torch.tensor([5, -1, 11]), kv_scale=scales)
    flat, flat_s = cache.view(-1, 20).float(), scales.view(-1)
    rows = torch.cat((kv_c, k_pe), -1)
    for token, slot in ((0, 5), (2, 11)):
        deq = flat[slot] * flat_s[slot]
        assert torch.all((deq - rows[token]).abs() <= rows[token].abs() / 16 + flat_s[slot] / 1024)
    untouched = [s for s in range(12) if s not in (5, 11)]
    assert torch.all(flat[untouched] == 0) and torch.all(flat_s[untouched] == -1)
