"""The CuTe DSL SM90 paged GQA decode against the torch reference on the H200: page sizes that
take one or several TMA boxes per tile, one CTA or a cluster of two per (request, KV head),
ragged and empty requests, group sizes 1-16, head dim 64 and 128, NaN in the unused slots of
a request's last page, and CUDA-graph replay with new block tables and lengths.

Skipped without an SM90 GPU or without ``nvidia-cutlass-dsl``.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0),
        reason="needs an SM90 GPU",
    ),
    pytest.mark.skipif(importlib.util.find_spec("cutlass") is None, reason="needs CuTe DSL"),
]

BF16 = {"atol": 6e-2, "rtol": 6e-2}
LENS = (2000, 1, 0, 4096, 777, 64, 129, 3000, 16, 65)


def _inputs(page_size, lens=LENS, q_heads=32, kv_heads=8, head_dim=128, seed=0, spare=4):
    """Ragged requests (one empty) over shuffled pages; ``spare`` unused pages at the end."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    lens_t = torch.tensor(lens, device="cuda", dtype=torch.int32)
    pages_per = [-(-n // page_size) for n in lens]
    width = max(max(pages_per), 1)
    total = sum(pages_per) + spare
    perm = torch.randperm(total, generator=gen, device="cuda").to(torch.int32)
    tables = torch.zeros(len(lens), width, dtype=torch.int32, device="cuda")
    used = 0
    for b, n in enumerate(pages_per):
        tables[b, :n] = perm[used : used + n]
        used += n
    shape = (total, page_size, kv_heads, head_dim)
    k = torch.randn(shape, generator=gen, device="cuda").to(torch.bfloat16)
    v = torch.randn(shape, generator=gen, device="cuda").to(torch.bfloat16)
    q = torch.randn(len(lens), q_heads, head_dim, generator=gen, device="cuda").to(torch.bfloat16)
    return q, k, v, tables, lens_t, head_dim**-0.5


def _run(inputs, config):
    from tokenspeed.kernels.cute_ops.decode_attention import paged_decode_attention

    return paged_decode_attention(*inputs, config=config)


def _reference(inputs):
    from tokenspeed.kernels.reference.attention import paged_decode_attention as ref

    return ref(*inputs).float()


@pytest.mark.parametrize("page_size", [8, 16, 32, 64, 128])
@pytest.mark.parametrize(("cluster", "stages"), [(1, 3), (2, 3), (2, 2), (1, 6), (3, 2), (4, 2)])
def test_cute_decode_matches_reference(page_size, cluster, stages):
    inputs = _inputs(page_size)
    out = _run(inputs, {"cluster": cluster, "stages": stages})
    torch.testing.assert_close(out.float(), _reference(inputs), **BF16)
    assert torch.all(out[2] == 0)  # the empty request


@pytest.mark.parametrize(("q_heads", "kv_heads", "head_dim"),
                         [(8, 8, 128), (32, 4, 128), (64, 4, 128), (28, 4, 128), (16, 2, 64),
                          (32, 8, 64)])  # fmt: skip
@pytest.mark.parametrize("cluster", [1, 2])
def test_cute_decode_group_sizes_and_head_dims(q_heads, kv_heads, head_dim, cluster):
    inputs = _inputs(16, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, seed=1)
    out = _run(inputs, {"cluster": cluster, "stages": 3})
    torch.testing.assert_close(out.float(), _reference(inputs), **BF16)


@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("cluster", [1, 2, 3])
def test_cute_decode_ignores_nan_past_each_request(page_size, cluster):
    """Slots past a request's length (in its last page, and whole unused pages) hold NaN: a
    fresh pool is uninitialised, and a zero softmax weight times NaN would still be NaN."""
    q, k, v, tables, lens, scale = _inputs(page_size, seed=2)
    want = _reference((q, k, v, tables, lens, scale))  # the reference reads whole pages
    valid = torch.zeros(k.shape[:2], dtype=torch.bool, device="cuda")
    for b, n in enumerate(lens.tolist()):
        for t in range(n):
            valid[tables[b, t // page_size], t % page_size] = True
    k[~valid] = float("nan")
    v[~valid] = float("nan")
    inputs = (q, k, v, tables, lens, scale)
    out = _run(inputs, {"cluster": cluster, "stages": 3})
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), want, **BF16)


@pytest.mark.parametrize("cluster", [1, 2, 3])
def test_cute_decode_graph_replays_new_tables_and_lengths(cluster):
    """Capture once, then change lengths, block tables and queries in place (as the engine's
    replay does): each replay matches an eager call on the new inputs."""
    page = 16
    q, k, v, tables, lens, scale = _inputs(page, seed=3, spare=64)
    config = {"cluster": cluster, "stages": 3}
    _run((q, k, v, tables, lens, scale), config)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _run((q, k, v, tables, lens, scale), config)
    gen = torch.Generator(device="cuda").manual_seed(4)
    for step in range(3):
        capacity = tables.shape[1] * page
        lens.copy_(torch.randint(0, capacity + 1, lens.shape, generator=gen, device="cuda"))
        tables.copy_(torch.randint(0, k.shape[0], tables.shape, generator=gen, device="cuda"))
        q.copy_(torch.randn(q.shape, generator=gen, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        want = _run((q, k, v, tables, lens, scale), config)
        torch.testing.assert_close(out, want, atol=0, rtol=0, msg=f"replay {step}")
        torch.testing.assert_close(out.float(), _reference((q, k, v, tables, lens, scale)), **BF16)


def test_registry_picks_cute_decode_on_hopper():
    from tokenspeed.kernels.selection import explain_selection

    sel = explain_selection("attention", "decode", {"q": "bfloat16", "kv_cache": "bfloat16"},
                            traits={"head_dim": 128, "v_head_dim": 128, "num_kv_heads": 8,
                                    "group_size": 4, "page_size": 16, "batch": 16,
                                    "kv_len": 8192, "kv_groups": 128})  # fmt: skip
    assert sel.chosen == "cute_paged_decode_sm90", sel
    assert sel.config == {"cluster": 2, "stages": 2, "evict_first": True}
    wide = explain_selection("attention", "decode", {"q": "bfloat16", "kv_cache": "bfloat16"},
                             traits={"head_dim": 128, "v_head_dim": 128, "num_kv_heads": 8,
                                     "group_size": 4, "page_size": 16, "batch": 64,
                                     "kv_len": 2048, "kv_groups": 512})  # fmt: skip
    assert wide.chosen == "triton_paged_decode", wide


def test_public_op_runs_the_cute_decode_where_it_is_chosen():
    """The public op at 16 x 4k (128 groups) goes through the CuTe kernel and matches."""
    import tokenspeed.kernels as K
    from tokenspeed.kernels.selection import selection_records

    inputs = _inputs(16, lens=(4096,) * 16, seed=5)
    out = K.paged_decode_attention(*inputs)
    torch.testing.assert_close(out.float(), _reference(inputs), **BF16)
    chosen = {r["kernel"] for r in selection_records() if r["op"] == "attention.decode"}
    assert "cute_paged_decode_sm90" in chosen
