"""The one-pass MoE (``fused_moe_onepass.py``) and the down weights stored ``[E, I, H]``.

In Triton's interpreter at small float32 shapes: the one-pass kernel against the reference
(one token, and tokens sharing experts), its self-resetting workspace, its refusal of the
other storage, every other MoE path on the transposed storage, the defaults and tuning space
that storage selects, and the runtime layer keeping its ``w2`` that way.
"""

from __future__ import annotations

import pytest
import torch

from tokenspeed.kernels.device import triton_available
from tokenspeed.kernels.reference import moe as ref_moe
from tokenspeed.kernels.triton_ops import configs

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed")


def _hidden_rows(w2: torch.Tensor) -> torch.Tensor:
    """The same ``[E, H, I]`` values stored ``[E, I, H]``."""
    return w2.transpose(1, 2).contiguous().transpose(1, 2)


def _moe(device, tokens, top_k, experts, hidden=48, inter=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) / inter**0.5
    weights, ids = ref_moe.moe_route(
        torch.randn(tokens, experts, generator=gen), top_k, renormalize=True
    )
    args = [t.to(device) for t in (x, w13, w2, weights, ids)]
    return args, ref_moe.fused_moe(*args)


def _close(actual, expected):
    torch.testing.assert_close(actual.float(), expected.float(), atol=2e-5, rtol=2e-5)


@needs_triton
@pytest.mark.parametrize(
    ("tokens", "top_k", "experts", "cfg"),
    [
        (1, 3, 8, {"block_i": 4, "num_stages": 2, "programs": 3}),
        (1, 2, 8, {"block_i": 8, "programs": 64}),  # more programs than items: some idle
        (2, 3, 4, {"block_i": 4, "programs": 5}),  # 6 pairs over 4 experts: shared
        (5, 3, 6, {"block_i": 2, "programs": 7}),  # odd token count: a half-empty row block
        (8, 2, 3, {"block_i": 16, "programs": 4}),  # a row block past the intermediate size
        (2, 2, 4, {"block_i": 4, "programs": 3, "pdl": "early"}),  # a plain launch here
    ],
)
def test_onepass_matches_the_reference_and_leaves_its_workspace_zeroed(
    device, tokens, top_k, experts, cfg
):
    from tokenspeed.kernels.triton_ops import arrival, fused_moe

    (x, w13, w2, weights, ids), want = _moe(device, tokens, top_k, experts)
    for _ in range(2):  # the second call relies on the first having reset everything
        out = fused_moe.fused_moe(x, w13, _hidden_rows(w2), weights, ids,
                                  config={"path": "onepass", **cfg})  # fmt: skip
        _close(out, want)
    used = {k: v for k, v in arrival._BUFFERS.items() if k[0].startswith("moe_onepass")}
    assert len(used) == 2 and not any(buf.any() for buf in used.values())


@needs_triton
def test_pdl_is_a_plain_launch_off_hopper_and_rejects_unknown_modes():
    from tokenspeed.kernels.triton_ops.pdl import pdl_constexprs, pdl_launch_options, pdl_mode

    cpu = torch.device("cpu")
    assert pdl_mode({"pdl": "early"}, cpu) == "" and pdl_mode({}, cpu) == ""
    assert pdl_launch_options("") == {} and pdl_launch_options("early") == {"launch_pdl": True}
    assert pdl_constexprs("early") == {"PDL_WAIT": True, "PDL_TRIGGER": True}
    assert pdl_constexprs("exit") == {"PDL_WAIT": True, "PDL_TRIGGER": False}
    with pytest.raises(ValueError, match="pdl='soon'"):
        pdl_mode({"pdl": "soon"}, cpu)


@needs_triton
def test_onepass_refuses_down_weights_stored_along_the_intermediate_dim(device):
    from tokenspeed.kernels.triton_ops import fused_moe

    (x, w13, w2, weights, ids), _ = _moe(device, 1, 2, 4)
    with pytest.raises(ValueError, match=r"stored \[E, I, H\]"):
        fused_moe.fused_moe(x, w13, w2, weights, ids, config={"path": "onepass"})
    many, _ = _moe(device, 9, 2, 4)
    many[2] = _hidden_rows(many[2])
    with pytest.raises(ValueError, match="1-8 tokens"):
        fused_moe.fused_moe(*many, config={"path": "onepass"})


@needs_triton
@pytest.mark.parametrize(
    "cfg",
    [
        {"block_m": 16, "block_n": 16, "block_k": 16, "num_warps": 4, "num_stages": 1},
        {"block_m": 16, "block_n": 16, "block_k": 16, "num_warps": 4, "num_stages": 1,
         "align": "triton", "reduce": "triton"},
        {"path": "sortfree", "block_m": 16, "block_n": 16, "block_k": 16, "num_warps": 4,
         "num_stages": 1, "down_block_n": 16, "down_block_k": 16},
        {"path": "sortfree", "down": "token", "block_m": 16, "block_n": 16, "block_k": 16,
         "num_warps": 4, "num_stages": 1, "down_block_n": 16, "down_block_k": 16,
         "down_num_stages": 1},
    ],
)  # fmt: skip
def test_every_two_launch_path_reads_down_weights_stored_either_way(device, cfg):
    from tokenspeed.kernels.triton_ops import fused_moe

    (x, w13, w2, weights, ids), want = _moe(device, 3, 2, 4)
    _close(fused_moe.fused_moe(x, w13, w2, weights, ids, config=cfg), want)
    _close(fused_moe.fused_moe(x, w13, _hidden_rows(w2), weights, ids, config=cfg), want)


def test_hidden_contiguous_down_weights_select_the_onepass_path_for_few_tokens():
    qwen = {"top_k": 8, "num_experts": 128, "hidden": 2048, "intermediate": 768}
    for tokens in (1, 2, 4):
        traits = {**qwen, "num_tokens": tokens, "w2_contiguous": "hidden"}
        assert configs.moe_default_config(traits)["path"] == "onepass"
        space = configs.moe_config_space(traits)
        assert space[0] == configs.moe_default_config(traits)
        assert sum(c.get("path") == "onepass" for c in space) > 1
        assert not any(c.get("down") == "token" for c in space)  # GEMV tiles along I
    for tokens in (8, 16):
        cfg = configs.moe_default_config({**qwen, "num_tokens": tokens,
                                          "w2_contiguous": "hidden"})  # fmt: skip
        assert cfg.get("path", "sorted") == "sorted" and cfg["align"] == "triton"
    # DeepSeek-V3's hidden 7168 still fits one-row tiles; a hidden past 16384 does not.
    v3 = {"top_k": 8, "num_experts": 256, "num_tokens": 1, "w2_contiguous": "hidden"}
    assert configs.moe_default_config({**v3, "hidden": 7168})["path"] == "onepass"
    wide = {**v3, "hidden": 20000}
    assert configs.moe_default_config(wide).get("path", "sorted") == "sorted"
    assert not any(c.get("path") == "onepass" for c in configs.moe_config_space(wide))
    assert {c["block_i"] for c in configs.moe_config_space({**v3, "hidden": 7168})
            if c.get("path") == "onepass" and "block_i" in c} == {1, 2}  # fmt: skip
    # The checkpoint layout keeps the two-launch defaults.
    cfg = configs.moe_default_config({**qwen, "num_tokens": 1, "w2_contiguous": "intermediate"})
    assert cfg["path"] == "sortfree" and cfg["down"] == "token"


@needs_triton
def test_the_runtime_layer_stores_w2_hidden_contiguous_and_the_registry_runs_it(device):
    from tokenspeed import kernels
    from tokenspeed.runtime.layers.moe import FusedMoE

    with torch.device(device):
        layer = FusedMoE(num_experts=4, top_k=2, hidden_size=48, intermediate_size=40,
                         renormalize=True)  # fmt: skip
    assert layer.w2.shape == (4, 48, 40) and layer.w2.stride(1) == 1
    (x, w13, w2, weights, ids), want = _moe(device, 1, 2, 4)
    layer._load_w2(layer.w2, w2[1], "1")  # one expert's checkpoint tensor [H, I]
    layer._load_w2(layer.w2, w2, "fused")
    assert torch.equal(layer.w2, w2) and layer.w2.stride(1) == 1
    out = kernels.fused_moe(x, w13, layer.w2, weights, ids)
    torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
