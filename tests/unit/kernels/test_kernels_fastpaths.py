"""The fast paths: SDPA extend candidate, the decode page-block path, small-batch MoE configs.

The SDPA candidate is plain torch, so on CPU it runs for real (its impl is called directly;
the registry keeps it to CUDA). The Triton paths run in the interpreter like the other
kernel tests.
"""

from __future__ import annotations

import pytest
import torch
from kernel_cases import paged_kv

import tokenspeed.kernels as K
from tokenspeed.kernels import explain_selection, kernel_override, selection_records
from tokenspeed.kernels.device import DeviceInfo, triton_available
from tokenspeed.kernels.ops.attention import extend_prefix_trait
from tokenspeed.kernels.reference import attention as ref_attn
from tokenspeed.kernels.reference import moe as ref_moe
from tokenspeed.kernels.torch_ops import sdpa_extend
from tokenspeed.kernels.triton_ops import configs

H200 = DeviceInfo(kind="cuda", vendor="nvidia", name="NVIDIA H200", compute=(9, 0), num_sms=132)
needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed")
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=4e-3, rtol=4e-3)}


def close(actual, expected, dtype, scale=1.0):
    tol = {k: v * scale for k, v in TOL[dtype].items()}
    torch.testing.assert_close(actual.float(), expected.float(), **tol)


# -- the prefix trait ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "batch", "capacity", "bound", "want"),
    [
        (1024, 1, 1024, None, "none"),  # one request filling its pages: no prefix possible
        (1000, 1, 1008, None, "any"),  # 8 slots of slack could hold a prefix
        (1000, 1, 1008, 1000, "none"),  # the host bound closes the slack
        (300, 3, 100, None, "none"),  # three requests of 100, each at the capacity
        (299, 3, 100, None, "any"),
        (200, 2, 128, None, "any"),
        (0, 0, 16, None, "any"),
    ],
)
def test_extend_prefix_trait_is_decided_from_shapes(tokens, batch, capacity, bound, want):
    assert extend_prefix_trait(tokens, batch, capacity, bound) == want


# -- the SDPA extend candidate ---------------------------------------------------------------


def _dense_extend(batch, length, page_size, heads, kv_heads, dtype, junk_cols=0):
    k_cache, v_cache, tables, lens = paged_kv([length] * batch, kv_heads, 32, page_size, dtype)
    # paged_kv pads one junk column; drop it, then add ``junk_cols`` junk columns back.
    tables = tables[:, : -(-length // page_size)]
    junk = torch.full((batch, junk_cols), 10_000, dtype=tables.dtype)
    tables = torch.cat([tables, junk], dim=1).contiguous()
    cu = torch.arange(0, (batch + 1) * length, length, dtype=torch.int32)
    q = torch.randn(batch * length, heads, 32).to(dtype)
    return q, k_cache, v_cache, tables, cu, lens


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("batch", "length", "page_size"), [(1, 37, 4), (3, 20, 16), (2, 64, 16)])
@pytest.mark.parametrize("gqa", ["expand", "native"])
def test_sdpa_extend_matches_reference(dtype, causal, batch, length, page_size, gqa):
    q, k_cache, v_cache, tables, cu, lens = _dense_extend(batch, length, page_size, 8, 2, dtype)
    want = ref_attn.paged_extend_attention(q, k_cache, v_cache, tables, cu, lens, 0.2, causal)
    out = sdpa_extend.paged_extend_attention(
        q, k_cache, v_cache, tables, cu, lens, 0.2, causal, config={"gqa": gqa}
    )
    assert out.shape == want.shape and out.dtype == q.dtype
    close(out, want, dtype, scale=2.0)


def test_sdpa_extend_ignores_junk_block_table_columns():
    q, k_cache, v_cache, tables, cu, lens = _dense_extend(1, 30, 8, 4, 4, torch.float32, 2)
    assert int(tables[0, -1]) == 10_000  # junk past the request's pages, never dereferenced
    want = ref_attn.paged_extend_attention(q, k_cache, v_cache, tables, cu, lens, 0.3)
    out = sdpa_extend.paged_extend_attention(q, k_cache, v_cache, tables, cu, lens, 0.3)
    close(out, want, torch.float32)


def _extend_traits(**extra):
    return {
        "head_dim": 128,
        "v_head_dim": 128,
        "num_kv_heads": 8,
        "group_size": 4,
        "page_size": 64,
        "causal": True,
        "num_tokens": 16384,
        "batch": 1,
        **extra,
    }


def test_sdpa_extend_ranks_above_triton_on_cuda_where_its_traits_hold():
    sig = {"q": "bfloat16", "kv_cache": "bfloat16"}
    expl = explain_selection(
        "attention", "extend", sig, traits=_extend_traits(prefix="none"), device=H200
    )
    assert expl.chosen == "sdpa_paged_extend", expl
    assert expl.config == {"gqa": "native"}
    with_prefix = explain_selection(
        "attention", "extend", sig, traits=_extend_traits(prefix="any"), device=H200
    )
    assert with_prefix.chosen != "sdpa_paged_extend"
    assert (
        "prefix"
        in next(c for c in with_prefix.candidates if c.kernel == "sdpa_paged_extend").reason
    )
    fp32 = explain_selection(
        "attention",
        "extend",
        {"q": "float32", "kv_cache": "float32"},
        traits=_extend_traits(prefix="none"),
        device=H200,
    )
    assert fp32.chosen != "sdpa_paged_extend"


def test_extend_op_reports_the_prefix_trait_and_stays_off_the_cuda_sdpa_candidate_on_cpu():
    q, k_cache, v_cache, tables, cu, lens = _dense_extend(2, 16, 4, 4, 2, torch.float32)
    out = K.paged_extend_attention(q, k_cache, v_cache, tables, cu, lens, 0.25)
    rec = [r for r in selection_records() if r["op"] == "attention.extend"][-1]
    # float32 on CPU: the CPU-only candidate (``cpu_paged_extend``), never the CUDA SDPA one
    assert "prefix=none" in rec["bucket"] and rec["kernel"] == "cpu_paged_extend"
    close(out, ref_attn.paged_extend_attention(q, k_cache, v_cache, tables, cu, lens, 0.25),
          torch.float32)  # fmt: skip


def test_sdpa_default_config_uses_native_gqa_for_grouped_heads():
    assert configs.sdpa_extend_default_config(_extend_traits())["gqa"] == "native"
    mha = _extend_traits(group_size=1)
    assert configs.sdpa_extend_default_config(mha)["gqa"] == "expand"


# -- decode: page-block fast path ------------------------------------------------------------


@needs_triton
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("block_n", [16, 32, 64])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_paged_decode_page_block_path(device, page_size, block_n, num_splits):
    from tokenspeed.kernels.triton_ops import decode_attention

    dtype = torch.float32
    seq_lens = [1, 150, 64, 0, 129, 200]  # ragged tails, whole pages, an empty request
    k_cache, v_cache, tables, lens = paged_kv(seq_lens, 2, 32, page_size, dtype, device)
    q = torch.randn(len(seq_lens), 8, 32, device=device)
    want = ref_attn.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.2)
    cfg = {"block_n": block_n, "num_warps": 4, "num_stages": 1, "num_splits": num_splits}
    out = decode_attention.paged_decode_attention(
        q, k_cache, v_cache, tables, lens, 0.2, config=cfg
    )
    close(out, want, dtype)
    assert torch.all(out[3] == 0)


@needs_triton
def test_paged_decode_default_config_through_the_op_on_big_pages(device):
    k_cache, v_cache, tables, lens = paged_kv([300, 64, 5], 1, 16, 64, torch.float16, device)
    q = torch.randn(3, 4, 16, device=device).half()
    with kernel_override("attention.decode", "triton"):
        out = K.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.3, max_seq_len=300)
    close(out, ref_attn.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.3),
          torch.float16)  # fmt: skip


def test_decode_defaults_are_the_measured_best():
    llama = {"head_dim": 128, "num_kv_heads": 8, "page_size": 64}
    # The split counts that measured fastest on the H200 for Llama-3-8B shapes.
    assert configs.decode_num_splits({**llama, "batch": 64, "kv_len": 2048}, sms=132) == 2
    assert configs.decode_num_splits({**llama, "batch": 16, "kv_len": 8192}, sms=132) == 5
    assert configs.decode_num_splits({**llama, "batch": 1, "kv_len": 256}, sms=132) == 1
    default = configs.decode_default_config({**llama, "batch": 16, "kv_len": 8192})
    assert (default["block_n"], default["num_warps"], default["num_stages"]) == (64, 4, 2)
    for c in configs.decode_config_space({**llama, "batch": 64, "kv_len": 2048}):
        assert c["num_splits"] >= 1


# -- fused MoE: small-batch configs ----------------------------------------------------------


def test_moe_default_config_depends_on_the_token_bucket():
    qwen = {"top_k": 8, "num_experts": 128}
    small = configs.moe_default_config({**qwen, "num_tokens": 1})
    assert small["block_n"] == 32 and small["block_m"] == 16
    assert configs.moe_default_config({**qwen, "num_tokens": 8})["block_n"] == 32
    # One pass on the [E, I, H] storage: 4 warps except at 2 tokens (H200, eleventh session).
    onepass = {**qwen, "w2_contiguous": "hidden"}
    warps = {t: configs.moe_default_config({**onepass, "num_tokens": t}) for t in (1, 2, 3, 4)}
    assert all(c["path"] == "onepass" for c in warps.values())
    assert [warps[t]["num_warps"] for t in (1, 2, 3, 4)] == [4, 8, 4, 4]
    assert configs.moe_default_config({**qwen, "num_tokens": 64})["block_n"] == 64
    assert configs.moe_default_config({**qwen, "num_tokens": 4096})["block_m"] == 64


@needs_triton
@pytest.mark.parametrize("tokens", [1, 3])
def test_fused_moe_split_tiles_are_deterministic(device, tokens):
    from tokenspeed.kernels.triton_ops import fused_moe

    hidden, inter, experts, top_k = 64, 48, 8, 4
    x = torch.randn(tokens, hidden, device=device)
    w13 = torch.randn(experts, 2 * inter, hidden, device=device) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, device=device) / inter**0.5
    weights, ids = ref_moe.moe_route(
        torch.randn(tokens, experts, device=device), top_k, renormalize=True
    )
    cfg = {
        "block_m": 16, "block_n": 16, "block_k": 32, "num_warps": 4, "num_stages": 1,
        "down_block_n": 32, "down_block_k": 16,
    }  # fmt: skip
    out = fused_moe.fused_moe(x, w13, w2, weights, ids, config=cfg)
    again = fused_moe.fused_moe(x, w13, w2, weights, ids, config=cfg)
    close(out, ref_moe.fused_moe(x, w13, w2, weights, ids), torch.float32)
    assert torch.equal(out, again)


@needs_triton
@pytest.mark.parametrize(("page_size", "block_n"), [(16, 16), (64, 32), (64, 64)])
@pytest.mark.parametrize("causal", [True, False])
def test_paged_extend_page_block_path(device, page_size, block_n, causal):
    import itertools

    from tokenspeed.kernels.triton_ops import extend_attention

    q_lens, seq_lens = [3, 70, 0, 20], [80, 130, 4, 20]
    k_cache, v_cache, tables, lens = paged_kv(seq_lens, 2, 32, page_size, torch.float32, device)
    cu = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device=device)
    q = torch.randn(sum(q_lens), 4, 32, device=device)
    want = ref_attn.paged_extend_attention(q, k_cache, v_cache, tables, cu, lens, 0.2, causal)
    cfg = {"block_m": 16, "block_n": block_n, "num_warps": 4, "num_stages": 1}
    out = extend_attention.paged_extend_attention(
        q, k_cache, v_cache, tables, cu, lens, 0.2, causal, config=cfg
    )
    close(out, want, torch.float32)
