"""DeepSeek (MLA) model on a GPU: the Triton MLA kernels and CUDA-graph decode inside the model.

Skipped without CUDA (and under ``TRITON_INTERPRET=1``). A tiny float32 V3 checkpoint against
transformers on CPU, through the executor alone and, for NGRAM and MTP speculative decoding,
through the engine; an FP8 latent cache; the DeepSeek-V3 shapes (128 heads, 512 + 64 latent)
with dummy weights in bf16, graph decode equal to eager decode.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") == "1", reason="Triton interpreter is on"
    ),
]

sys.path.insert(0, str(Path(__file__).parents[1] / "unit" / "runtime"))


def _executor(path, **kw):
    from tokenspeed.runtime.model_executor import ExecutorConfig, ModelExecutor

    args = dict(device="cuda", page_size=16, max_total_tokens=8192, max_num_seqs=16)
    args.update(kw)
    return ModelExecutor(ExecutorConfig(model_path=path, **args))


@pytest.fixture(scope="module")
def tiny_v3(tmp_path_factory):
    from runtime_helpers import hf_greedy, hf_model, make_prompts
    from test_deepseek import make_deepseek_checkpoint

    path = make_deepseek_checkpoint("v3", tmp_path_factory.mktemp("dsv3") / "v3")
    prompts = make_prompts(seed=3)
    return path, prompts, hf_greedy(hf_model(path), prompts, 16)


def test_tiny_v3_matches_transformers_on_cuda(tiny_v3):
    from runtime_helpers import run_without_scheduler

    path, prompts, (ref_tokens, ref_logits) = tiny_v3
    ex = _executor(path)
    assert ex.graph_runner is not None  # decode replays captured graphs
    tokens, logits = run_without_scheduler(ex, prompts, 16, chunk=7)
    assert tokens == ref_tokens
    for ours, ref in zip(logits, ref_logits, strict=True):
        torch.testing.assert_close(torch.stack(ours).cpu(), ref, atol=2e-3, rtol=0)


def test_tiny_v3_ngram_speculative_on_cuda(tiny_v3):
    """Drafted blocks as multi-token queries of the registry's MLA decode on the GPU, replayed
    from the verify graphs: the greedy tokens stay transformers'."""
    from tokenspeed.runtime import LLM, SamplingParams

    path, prompts, (ref_tokens, _) = tiny_v3
    llm = LLM(str(path), device="cuda", page_size=64, max_total_tokens=8192,
              speculative_algorithm="NGRAM", speculative_num_draft_tokens=4)  # fmt: skip
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16))
    assert [o.outputs[0].token_ids for o in outs] == ref_tokens
    ex = llm.engine.executor
    assert ex.spec_multi_token_steps > 0
    assert ex.verify_graph_runner is not None and ex.verify_graph_runner.replays > 0


def test_tiny_v3_mtp_speculative_on_cuda(tiny_v3, tmp_path):
    """The MTP drafter on the GPU (its layer's chain as absorbed one-row decodes replayed
    from its own CUDA graphs, its own pool layer, the target's CUDA-graph decode between): transformers' greedy tokens, and
    every request's drafts and their hidden states equal the layer run from scratch."""
    from runtime_helpers import hf_model
    from test_deepseek import MTP, _hf_mtp_layer, _mtp_reference, _with_mtp

    from tokenspeed.runtime import LLM, SamplingParams

    path, prompts, (ref_tokens, _) = tiny_v3
    extra = _with_mtp(path, tmp_path / "mtp")
    hf = hf_model(tmp_path / "mtp")
    layer = _hf_mtp_layer(hf, extra)
    llm = LLM(str(tmp_path / "mtp"), device="cuda", page_size=64, max_total_tokens=8192,
              enable_prefix_caching=False, **MTP)  # fmt: skip
    drafter = llm.engine.executor.drafter
    real, seen = drafter.propose, []

    def propose(slots, positions, tables, count):
        got = real(slots, positions, tables, count)
        for slot, drafts in zip(slots.tolist(), got.per_request(), strict=True):
            if len(drafts):
                hist = drafter.history.tokens(slot).tolist()
                seen.append((hist, drafts.tolist(), drafter.carry[slot].float().cpu()))
        return got

    drafter.propose = propose
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16))
    assert [o.outputs[0].token_ids for o in outs] == ref_tokens
    ex = llm.engine.executor
    assert ex.spec_multi_token_steps > 0 and len(seen) > 20
    assert ex.verify_graph_runner is not None and ex.verify_graph_runner.replays > 0
    assert drafter.graphs is not None and drafter.graphs.replays > 0  # the layer's own graphs
    for hist, drafts, first in seen:
        want, states = _mtp_reference(hf, layer, extra, hist, len(drafts))
        assert drafts == want
        torch.testing.assert_close(first, states[0], atol=2e-3, rtol=0)


def test_tiny_v3_fp8_latent_cache_on_cuda(tiny_v3):
    from runtime_helpers import run_without_scheduler

    path, prompts, (ref_tokens, ref_logits) = tiny_v3
    ex = _executor(path, kv_cache_dtype="fp8_e4m3")
    tokens, logits = run_without_scheduler(ex, prompts[:4], 4, chunk=9)
    for i in range(4):
        err = (torch.stack(logits[i]).cpu() - ref_logits[i][:4]).abs()
        assert float(err.mean()) < 0.05 and float(err.max()) < 0.25


def test_tiny_v3_mtp_over_an_fp8_cache_on_cuda(tiny_v3, tmp_path):
    """MTP drafts over an FP8 latent cache (the MTP layer's own latents quantized in its
    CUDA graphs too): plain decoding's tokens over that cache."""
    from test_deepseek import MTP, _with_mtp

    from tokenspeed.runtime import LLM, SamplingParams

    path, prompts, _ = tiny_v3
    _with_mtp(path, tmp_path / "mtp")
    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    common = dict(device="cuda", page_size=64, max_total_tokens=8192, kv_cache_dtype="fp8_e4m3")
    plain = LLM(str(tmp_path / "mtp"), **common).generate(prompts, greedy)
    llm = LLM(str(tmp_path / "mtp"), **common, **MTP)
    outs = llm.generate(prompts, greedy)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in plain]
    drafter = llm.engine.executor.drafter
    assert drafter.graphs is not None and drafter.graphs.replays > 0


def test_deepseek_v3_shapes_graph_decode_equals_eager():
    """Real V3 attention dims (128 heads, latent 576), two layers, bf16, dummy weights."""
    import numpy as np
    from runtime_helpers import Op

    from tokenspeed.runtime.forward_batch import ForwardMode
    from tokenspeed.runtime.model_source import resolve_model_path
    from tokenspeed.runtime.sampling import SamplingParams

    small = {"num_hidden_layers": 2, "first_k_dense_replace": 1, "n_routed_experts": 16,
             "num_nextn_predict_layers": 0, "vocab_size": 4096}  # fmt: skip
    path = resolve_model_path("deepseek-v3", "dummy")
    common = dict(load_format="dummy", hf_overrides=small, dtype="bfloat16", max_model_len=4096)
    graph = _executor(path, **common)
    eager = _executor(path, disable_cuda_graph=True, **common)
    assert graph.graph_runner is not None and graph.kv_pool.layout.latent_dim == 576
    rng = np.random.default_rng(0)
    lens = [300, 17, 1000, 64]
    tables = np.arange(4 * 80, dtype=np.int32).reshape(4, 80)
    prompts = [rng.integers(0, 4096, n).astype(np.int32) for n in lens]
    names, rows, ones = [f"r{i}" for i in range(4)], np.arange(4), np.ones(4, bool)
    tokens: list[np.ndarray] = []  # the graph run's tokens feed both runs
    logits: list[list[torch.Tensor]] = [[], []]
    for run, ex in enumerate((graph, eager)):
        for slot in range(4):
            ex.install_request(slot, SamplingParams(temperature=0.0), 0, prompts[slot], [])
        seq = np.array(lens, np.int32)
        prefill = Op(ForwardMode.EXTEND, names, rows, np.zeros(4, np.int32), seq, seq,
                     np.concatenate(prompts), tables, ones)  # fmt: skip
        first = ex.execute(prefill).tokens
        if run == 0:
            tokens.append(first)
        for step in range(8):
            seq = seq + 1
            op = Op(ForwardMode.DECODE, names, rows, seq - 1, np.ones(4, np.int32), seq,
                    tokens[step].astype(np.int32), tables, ones)  # fmt: skip
            res = ex.execute(op, return_logits=True)
            logits[run].append(res.logits.float().cpu())
            if run == 0:
                tokens.append(res.tokens)
    for g, e in zip(*logits, strict=True):
        assert torch.isfinite(g).all()
        scale = float(e.abs().max())
        assert float((g - e).abs().max()) <= 0.05 * scale + 1e-3


def test_deepseek_v3_shapes_verify_graph_equals_eager():
    """Speculative verify blocks (4-token queries over the latent cache, V3 attention dims,
    bf16, dummy weights) replayed from the verify graphs equal the same blocks run eagerly,
    with a batch that leaves padded requests in the graph's bucket; and each block's first
    row equals a plain one-token decode of the same token up to bf16 rounding (the kernels
    differ in shape, so only a wrong page or length would move it far)."""
    import numpy as np
    from runtime_helpers import Op

    from tokenspeed.runtime.forward_batch import ForwardMode, SyntheticOp
    from tokenspeed.runtime.model_source import resolve_model_path
    from tokenspeed.runtime.sampling import SamplingParams

    small = {"num_hidden_layers": 2, "first_k_dense_replace": 1, "n_routed_experts": 16,
             "num_nextn_predict_layers": 0, "vocab_size": 4096}  # fmt: skip
    ex = _executor(resolve_model_path("deepseek-v3", "dummy"), load_format="dummy",
                   hf_overrides=small, dtype="bfloat16", max_model_len=4096,
                   speculative_algorithm="NGRAM", speculative_num_draft_tokens=4)  # fmt: skip
    runner = ex.verify_graph_runner
    assert runner is not None and runner.q_len == 4
    rng = np.random.default_rng(1)
    lens = np.array([300, 17, 1000], np.int32)
    tables = np.arange(3 * 80, dtype=np.int32).reshape(3, 80)
    prompts = [rng.integers(0, 4096, n).astype(np.int32) for n in lens]
    for slot in range(3):
        ex.install_request(slot, SamplingParams(temperature=0.0), 0, prompts[slot], [])
    ex.execute(Op(ForwardMode.EXTEND, ["a", "b", "c"], np.arange(3), np.zeros(3, np.int32), lens,
                  lens, np.concatenate(prompts), tables, np.ones(3, bool)))  # fmt: skip
    owner = np.repeat(np.arange(3), 4)
    positions = lens[owner].astype(np.int64) + np.tile(np.arange(4), 3)
    view = SyntheticOp(ForwardMode.DECODE, [], owner, positions, np.ones(12, np.int64),
                       positions + 1, rng.integers(0, 4096, 12), tables[owner],
                       np.ones(12, bool), num_decode=12, decode_q_len=4)  # fmt: skip
    _, _, eager = ex._run_model(view, ex.attn_backend, want_logits=True, allow_graph=False)
    before = runner.replays
    _, _, graph = ex._run_model(view, ex.attn_backend, want_logits=True, allow_graph=True)
    assert runner.replays == before + 1  # three requests in the bucket of four
    assert torch.isfinite(graph).all()
    scale = float(eager.abs().max())
    assert float((graph - eager).abs().max()) <= 0.02 * scale + 1e-3
    plain_op = SyntheticOp(ForwardMode.DECODE, [], np.arange(3), lens.astype(np.int64),
                           np.ones(3, np.int64), lens + 1, view.input_ids[::4], tables,
                           np.ones(3, bool), num_decode=3)  # fmt: skip
    _, _, plain = ex._run_model(plain_op, ex.attn_backend, want_logits=True, allow_graph=False)
    first_rows = eager.view(3, 4, -1)[:, 0].float()
    assert float((first_rows - plain.float()).abs().max()) <= 0.05 * scale + 1e-2
