"""Programmatic dependent launch (``pdl`` config key) keeps stream order exact.

Each test chains calls so that call ``i + 1`` reads call ``i``'s output, captures the chain in
a CUDA graph, and checks every call against the reference computed from what the previous
call actually wrote: a kernel that read its input before the kernel before it had finished
would see an unwritten buffer. The one-pass MoE also reuses its self-resetting workspace and
arrival counter from call to call, so an early start would corrupt the sums.

Skipped without a CUDA device of compute capability 9.0 or newer, and under the interpreter.
"""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
        reason="needs a CUDA device with PDL (sm_90+)",
    ),
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") == "1", reason="Triton interpreter is on"
    ),
]

CHAIN = 6
SCALE = 4.0


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


def _moe(tokens: int):
    from tokenspeed.kernels.workloads import make_inputs

    shape = {"tokens": tokens, "hidden": 2048, "intermediate": 768, "num_experts": 128,
             "top_k": 8, "w2_contiguous": "hidden"}  # fmt: skip
    return make_inputs("moe.experts", shape, torch.bfloat16, "cuda").args


def _relative_error(out: torch.Tensor, expect: torch.Tensor) -> float:
    expect = expect.float()
    assert expect.abs().amax() > 0
    return float((out.float() - expect).abs().amax() / expect.abs().amax())


def _workspace_is_zero() -> None:
    from tokenspeed.kernels.triton_ops import arrival

    for (name, _, dtype), buf in arrival._BUFFERS.items():
        if name.startswith("moe_onepass"):
            assert not buf.any(), f"{name} ({dtype}) left non-zero"


@pytest.mark.parametrize("mode", ["early", "exit"])
@pytest.mark.parametrize("tokens", [1, 3])
def test_onepass_moe_chain_with_pdl_matches_reference(tokens, mode):
    """Each call reads the previous call's (normalised) output."""
    from tokenspeed.kernels.reference.moe import fused_moe as ref
    from tokenspeed.kernels.triton_ops.fused_moe import fused_moe

    x, w13, w2, weights, ids = _moe(tokens)
    config = {"path": "onepass", "num_warps": 8, "num_stages": 3, "pdl": mode}

    def call(inp: torch.Tensor) -> torch.Tensor:
        out = fused_moe(inp, w13, w2, weights, ids, config=config)
        # The experts are about quadratic in x: without this the chain would underflow.
        return out / out.abs().amax()

    inputs, outputs = _chain_in_graph(call, x)
    for inp, out in zip(inputs, outputs, strict=True):
        expect = ref(inp, w13, w2, weights, ids).float()
        assert _relative_error(out, expect / expect.abs().amax()) < 2e-2
    _workspace_is_zero()


@pytest.mark.parametrize("mode", ["early", "exit"])
def test_onepass_moe_back_to_back_with_pdl_reuses_its_workspace(mode):
    """Nothing between the calls: each starts right after the previous one's last program
    has written the output and zeroed the shared workspace."""
    from tokenspeed.kernels.reference.moe import fused_moe as ref
    from tokenspeed.kernels.triton_ops.fused_moe import fused_moe

    x, w13, w2, weights, ids = _moe(2)
    config = {"path": "onepass", "num_warps": 8, "num_stages": 3, "pdl": mode}
    _, outputs = _chain_in_graph(lambda _: fused_moe(x, w13, w2, weights, ids, config=config), x)
    expect = ref(x, w13, w2, weights, ids)
    for out in outputs:
        assert _relative_error(out, expect) < 2e-2
    _workspace_is_zero()


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

    gen = torch.Generator(device="cuda").manual_seed(0)
    lens = torch.tensor([2000, 1, 0, 4096, 777, 129], device="cuda", dtype=torch.int32)
    page = 16
    pages_per = (lens + page - 1) // page
    total = int(pages_per.sum()) + 1
    perm = torch.randperm(total, generator=gen, device="cuda")
    tables = torch.zeros(lens.numel(), int(pages_per.max()), dtype=torch.int32, device="cuda")
    used = 0
    for b, n in enumerate(pages_per.tolist()):
        tables[b, :n] = perm[used : used + n]
        used += n
    k = torch.randn(total, page, 8, 128, generator=gen, device="cuda").to(torch.bfloat16)
    v = torch.randn(total, page, 8, 128, generator=gen, device="cuda").to(torch.bfloat16)
    q = torch.randn(lens.numel(), 32, 128, generator=gen, device="cuda").to(torch.bfloat16)
    config = {"num_warps": 4, "num_stages": 2, **cfg, "pdl": mode}

    def call(inp: torch.Tensor) -> torch.Tensor:
        # The output [B, 32, 128] is the next call's query, back to back; a large softmax
        # scale keeps the scores of these small queries spread.
        return paged_decode_attention(inp, k, v, tables, lens, SCALE, config=config)

    inputs, outputs = _chain_in_graph(call, q)
    for inp, out in zip(inputs, outputs, strict=True):
        assert _relative_error(out, ref(inp, k, v, tables, lens, SCALE)) < 3e-2
        assert torch.all(out[2] == 0)
