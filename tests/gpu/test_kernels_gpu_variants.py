"""The decode and MoE paths of the defaults and the tuning space on a real GPU: bf16 at model
shapes, ragged lengths, CUDA-graph capture and replay (the fused merge keeps arrival counters
on the device, and the TMA path bakes host-built descriptors into the graph; a replay must
reset the counters like an eager call, and stay right when the block tables, lengths and
queries change between replays, as in the engine).

Skipped without CUDA, and when ``TRITON_INTERPRET=1`` is set.
"""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") == "1", reason="Triton interpreter is on"
    ),
]

BF16 = {"atol": 6e-2, "rtol": 6e-2}
DECODE = [
    (16, {"block_n": 64, "num_splits": 4, "merge": "fused"}),
    (16, {"block_n": 32, "num_stages": 3, "num_splits": 3, "carry_pages": True, "merge": "fused"}),
    (16, {"block_n": 16, "num_stages": 4, "num_splits": 2, "carry_pages": True, "tma": True}),
    (64, {"block_n": 64, "num_splits": 3, "tma": True, "merge": "fused"}),
    (64, {"block_n": 64, "num_splits": 1, "tma": True}),
    (64, {"block_n": 64, "num_splits": 1, "maxnreg": 128}),
    (16, {"block_n": 64, "num_splits": 1}),
]  # fmt: skip


def _decode_inputs(page_size: int, lens=(2000, 1, 0, 4096, 777, 64, 129, 3000, 16), seed=0):
    """Llama-3-8B heads, 9 requests of ragged length (one empty), pages shuffled."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    lens = torch.tensor(lens, device="cuda")
    pages_per = (lens + page_size - 1) // page_size
    width = int(pages_per.max())
    total = int(pages_per.sum()) + 1
    perm = torch.randperm(total, generator=gen, device="cuda")
    tables = torch.zeros(lens.numel(), width, dtype=torch.int32, device="cuda")
    used = 0
    for b, n in enumerate(pages_per.tolist()):
        tables[b, :n] = perm[used : used + n]
        used += n
    shape = (total, page_size, 8, 128)
    k = torch.randn(shape, generator=gen, device="cuda").to(torch.bfloat16)
    v = torch.randn(shape, generator=gen, device="cuda").to(torch.bfloat16)
    q = torch.randn(lens.numel(), 32, 128, generator=gen, device="cuda").to(torch.bfloat16)
    return q, k, v, tables, lens.to(torch.int32), 128**-0.5


def _captured(fn, inputs):
    eager = fn(inputs).clone()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(inputs)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    return eager, out


@pytest.mark.parametrize(("page_size", "cfg"), DECODE)
def test_decode_variant_matches_reference_and_replays(page_size, cfg):
    from tokenspeed.kernels.reference.attention import paged_decode_attention as ref
    from tokenspeed.kernels.triton_ops.decode_attention import paged_decode_attention

    inputs = _decode_inputs(page_size)
    config = {"num_warps": 4, "num_stages": 2, "num_splits": 1, **cfg}
    eager, replayed = _captured(lambda i: paged_decode_attention(*i, config=config), inputs)
    torch.testing.assert_close(eager.float(), ref(*inputs).float(), **BF16)
    assert torch.all(eager[2] == 0)
    torch.testing.assert_close(replayed, eager, atol=0, rtol=0)  # deterministic merges


MOE = [
    (1, {"path": "sortfree", "down": "token"}),
    (4, {"path": "sortfree", "reduce": "triton"}),
    (8, {"path": "sortfree", "down": "token", "block_n": 32, "down_block_n": 16,
         "down_block_k": 256}),
    (64, {"align": "triton", "reduce": "triton"}),
    (256, {"align": "triton", "reduce": "triton", "block_m": 32, "block_n": 64, "block_k": 64}),
]  # fmt: skip
# w2 stored [E, H, I] ("k", the checkpoints') or [E, I, H] ("n", the runtime layer's)
W2_CONTIGUOUS = {"k": "intermediate", "n": "hidden"}
SMALL = {"block_m": 16, "block_n": 16, "block_k": 128, "num_warps": 4, "num_stages": 4,
         "down_block_n": 8, "down_block_k": 512, "down_num_stages": 4}  # fmt: skip


@pytest.mark.parametrize("w2_order", ["k", "n"])
@pytest.mark.parametrize(("tokens", "cfg"), MOE)
def test_moe_variant_matches_reference_and_replays(tokens, cfg, w2_order):
    """Each path with the down weights stored [E, H, I] (k) or [E, I, H] (n)."""
    from tokenspeed.kernels.reference.moe import fused_moe as ref
    from tokenspeed.kernels.triton_ops.fused_moe import fused_moe
    from tokenspeed.kernels.workloads import make_inputs

    shape = {"tokens": tokens, "hidden": 2048, "intermediate": 768, "num_experts": 128,
             "top_k": 8, "w2_contiguous": W2_CONTIGUOUS[w2_order]}  # fmt: skip
    inputs = make_inputs("moe.experts", shape, torch.bfloat16, "cuda").args
    config = {**SMALL, **cfg}
    eager, replayed = _captured(lambda i: fused_moe(*i, config=config), inputs)
    torch.testing.assert_close(eager.float(), ref(*inputs).float(), **BF16)
    torch.testing.assert_close(replayed, eager, atol=0, rtol=0)


@pytest.mark.parametrize(("page_size", "lens_a", "lens_b"), [
    (64, [2048] * 64, [100, 2047, 1, 0] * 16),  # TMA, one split
    (64, [8192] * 16, [8000, 3, 0, 4096] * 4),  # TMA, fused merge
    (16, [2048] * 64, [1, 2048, 0, 513] * 16),  # carried 32-token tiles, one split
    (16, [8192] * 16, [8191, 2, 5000, 0] * 4),  # one wide program per (request, KV head)
    (16, [8192] * 8, [8191, 2, 5000, 0] * 2),  # carried page ids, fused merge
])  # fmt: skip
def test_default_decode_replays_with_new_tables_lengths_and_queries(page_size, lens_a, lens_b):
    """The engine's pattern: capture once through the op, then copy each step's block
    tables, lengths and queries into the captured buffers and replay. The K/V pool (what the
    TMA descriptors address) stays put; everything else changes."""
    from tokenspeed import kernels
    from tokenspeed.kernels.reference.attention import paged_decode_attention as ref

    q, k, v, tables, lens, scale = _decode_inputs(page_size, lens_a, seed=1)
    width = tables.shape[1]
    call = lambda: kernels.paged_decode_attention(  # noqa: E731
        q, k, v, tables, lens, scale, max_seq_len=width * page_size
    )
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    # New step: other lengths and other pages of the same pool, new queries.
    _, _, _, tables_b, lens_b_t, _ = _decode_inputs(page_size, lens_b, seed=2)
    assert tables_b.shape[1] <= width and int(tables_b.max()) < k.shape[0]
    tables.zero_()
    tables[:, : tables_b.shape[1]].copy_(tables_b)
    lens.copy_(lens_b_t)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), ref(q, k, v, tables, lens, scale).float(), **BF16)
    assert torch.all(out[lens == 0] == 0)
    torch.testing.assert_close(out, call(), atol=0, rtol=0)  # same plan as an eager call


@pytest.mark.parametrize("w2_order", ["k", "n"])
@pytest.mark.parametrize("tokens", [1, 2, 4, 8, 16, 32, 256])
def test_default_moe_replays_with_new_routing(tokens, w2_order):
    """The registry's default for the down weights stored [E, H, I] (k) or, as the runtime
    layer keeps them, [E, I, H] (n: the one-pass kernel up to four tokens)."""
    from tokenspeed import kernels
    from tokenspeed.kernels.workloads import make_inputs

    shape = {"tokens": tokens, "hidden": 2048, "intermediate": 768, "num_experts": 128,
             "top_k": 8, "w2_contiguous": W2_CONTIGUOUS[w2_order]}  # fmt: skip
    inputs = make_inputs("moe.experts", shape, torch.bfloat16, "cuda").args
    kernels.fused_moe(*inputs)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernels.fused_moe(*inputs)
    _replay_with_new_routing(graph, out, inputs, shape, seed=7)


def _replay_with_new_routing(graph, out, inputs, shape, seed):
    """New activations and another seed's routing copied into the captured inputs, one
    replay, and the output checked against the reference on those inputs."""
    from tokenspeed.kernels.reference.moe import fused_moe as ref
    from tokenspeed.kernels.workloads import make_inputs

    x, w13, w2, weights, ids = inputs
    _, _, _, weights_b, ids_b = make_inputs("moe.experts", shape, torch.bfloat16, "cuda",
                                            seed=seed).args  # fmt: skip
    x.copy_(torch.randn_like(x))
    weights.copy_(weights_b)
    ids.copy_(ids_b)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), ref(x, w13, w2, weights, ids).float(), **BF16)


@pytest.mark.parametrize("tokens", [1, 2, 3, 8])
@pytest.mark.parametrize(
    ("hidden", "inter", "experts", "extra"),
    [
        (2048, 768, 128, {}),
        (2048, 768, 128, {"pdl": ""}),  # a plain launch (PDL is the default)
        (7168, 2048, 16, {}),
    ],
)
def test_onepass_moe_replays_with_new_routing_and_leaves_its_workspace_zeroed(
    tokens, hidden, inter, experts, extra
):
    """One launch over both projections (w2 stored [E, I, H]): the float32 workspace and the
    arrival counter must be zero again after every call, eager or replayed, so replay after
    replay with new inputs stays right."""
    from tokenspeed.kernels.reference.moe import fused_moe as ref
    from tokenspeed.kernels.triton_ops.fused_moe import fused_moe
    from tokenspeed.kernels.workloads import make_inputs

    shape = {"tokens": tokens, "hidden": hidden, "intermediate": inter,
             "num_experts": experts, "top_k": 8, "w2_contiguous": "hidden"}  # fmt: skip
    inputs = make_inputs("moe.experts", shape, torch.bfloat16, "cuda").args
    config = {"path": "onepass", "block_i": 4 if hidden <= 2048 else 1, "num_stages": 3,
              "num_warps": 8, **extra}  # fmt: skip
    eager = fused_moe(*inputs, config=config)
    torch.testing.assert_close(eager.float(), ref(*inputs).float(), **BF16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(*inputs, config=config)
    for seed in range(1, 6):
        _replay_with_new_routing(graph, out, inputs, shape, seed)
    _assert_onepass_workspace_zeroed()


def _assert_onepass_workspace_zeroed() -> None:
    from tokenspeed.kernels.triton_ops import arrival

    for (name, _, dtype), buf in arrival._BUFFERS.items():
        if name.startswith("moe_onepass"):
            assert not buf.any(), f"{name} ({dtype}) left non-zero"


# -- programmatic dependent launch (the ``pdl`` config key) ----------------------------------
# Each test chains calls in a CUDA graph so that call i + 1 reads call i's output (or, for the
# MoE back to back, reuses its workspace), and checks every call against the reference on what
# it actually read: a kernel that started before the one ahead had finished would see an
# unwritten buffer or a workspace not yet zeroed. With the wait removed these tests fail.

needs_pdl = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
    reason="programmatic dependent launch needs sm_90+",
)
CHAIN = 6


def _chain_in_graph(call, first_input):
    """Capture ``CHAIN`` calls, each fed the previous output; returns (inputs, outputs)."""
    call(first_input)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        inputs, outputs = [], []
        x = first_input
        for _ in range(CHAIN):
            inputs.append(x)
            x = call(x)
            outputs.append(x)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    return inputs, outputs


def _qwen_moe(tokens: int):
    from tokenspeed.kernels.workloads import make_inputs

    shape = {"tokens": tokens, "hidden": 2048, "intermediate": 768, "num_experts": 128,
             "top_k": 8, "w2_contiguous": "hidden"}  # fmt: skip
    return make_inputs("moe.experts", shape, torch.bfloat16, "cuda").args


def _relative_error(out: torch.Tensor, expect: torch.Tensor) -> float:
    expect = expect.float()
    assert expect.abs().amax() > 0
    return float((out.float() - expect).abs().amax() / expect.abs().amax())


@needs_pdl
@pytest.mark.parametrize("mode", ["early", "exit"])
@pytest.mark.parametrize("tokens", [1, 3])
def test_onepass_moe_chain_with_pdl_matches_reference(tokens, mode):
    """Each call reads the previous call's (normalised) output."""
    from tokenspeed.kernels.reference.moe import fused_moe as ref
    from tokenspeed.kernels.triton_ops.fused_moe import fused_moe

    x, w13, w2, weights, ids = _qwen_moe(tokens)
    config = {"path": "onepass", "num_warps": 8, "num_stages": 3, "pdl": mode}

    def call(inp: torch.Tensor) -> torch.Tensor:
        out = fused_moe(inp, w13, w2, weights, ids, config=config)
        # The experts are about quadratic in x: without this the chain would underflow.
        return out / out.abs().amax()

    inputs, outputs = _chain_in_graph(call, x)
    for inp, out in zip(inputs, outputs, strict=True):
        expect = ref(inp, w13, w2, weights, ids).float()
        assert _relative_error(out, expect / expect.abs().amax()) < 2e-2
    _assert_onepass_workspace_zeroed()


@needs_pdl
@pytest.mark.parametrize("mode", ["early", "exit"])
def test_onepass_moe_back_to_back_with_pdl_reuses_its_workspace(mode):
    """Nothing between the calls: each starts right after the previous one's last program
    has written the output and zeroed the shared workspace."""
    from tokenspeed.kernels.reference.moe import fused_moe as ref
    from tokenspeed.kernels.triton_ops.fused_moe import fused_moe

    x, w13, w2, weights, ids = _qwen_moe(2)
    config = {"path": "onepass", "num_warps": 8, "num_stages": 3, "pdl": mode}
    _, outputs = _chain_in_graph(lambda _: fused_moe(x, w13, w2, weights, ids, config=config), x)
    expect = ref(x, w13, w2, weights, ids)
    for out in outputs:
        assert _relative_error(out, expect) < 2e-2
    _assert_onepass_workspace_zeroed()


@needs_pdl
@pytest.mark.parametrize("mode", ["early", "exit"])
@pytest.mark.parametrize(
    "cfg",
    [
        {"block_n": 128, "num_stages": 3, "num_warps": 8, "num_splits": 1, "carry_pages": True},
        {"block_n": 32, "num_stages": 3, "num_splits": 3, "carry_pages": True, "merge": "fused"},
        {"block_n": 64, "num_stages": 2, "num_splits": 2},
    ],
)
def test_decode_chain_with_pdl_matches_reference(cfg, mode):
    from tokenspeed.kernels.reference.attention import paged_decode_attention as ref
    from tokenspeed.kernels.triton_ops.decode_attention import paged_decode_attention

    q, k, v, tables, lens, _ = _decode_inputs(16, lens=(2000, 1, 0, 4096, 777, 129))
    config = {"num_warps": 4, "num_stages": 2, **cfg, "pdl": mode}
    scale = 4.0  # keeps the scores of the chain's small queries spread

    def call(inp: torch.Tensor) -> torch.Tensor:
        # The output [B, 32, 128] is the next call's query, back to back.
        return paged_decode_attention(inp, k, v, tables, lens, scale, config=config)

    inputs, outputs = _chain_in_graph(call, q)
    for inp, out in zip(inputs, outputs, strict=True):
        assert _relative_error(out, ref(inp, k, v, tables, lens, scale)) < 3e-2
        assert torch.all(out[2] == 0)
