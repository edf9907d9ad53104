"""GPU smoke tests of the runtime (skipped without CUDA).

The tiny transformers checkpoint matches transformers on CUDA through the executor; the
offline LLM generates with the embedded tiny model and with a dummy-weight Qwen3-8B shape.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

sys.path.insert(0, str(Path(__file__).parents[1] / "unit" / "runtime"))


def test_executor_parity_on_cuda(tmp_path):
    from runtime_helpers import (
        hf_greedy,
        hf_model,
        make_prompts,
        make_tiny_checkpoint,
        run_without_scheduler,
    )

    from tokenspeed.runtime.model_executor import ExecutorConfig, ModelExecutor

    path = make_tiny_checkpoint("qwen3", tmp_path / "q3")
    prompts = make_prompts()
    ex = ModelExecutor(
        ExecutorConfig(model_path=path, device="cuda", page_size=16, max_total_tokens=8192)
    )
    ours, logits = run_without_scheduler(ex, prompts, 16)
    ref = hf_model(path)
    tokens, ref_logits = hf_greedy(ref, prompts, 16)
    assert ours == tokens
    for a, b in zip(logits, ref_logits, strict=True):
        torch.testing.assert_close(torch.stack(a).cpu(), b, atol=1e-3, rtol=0)


def test_llm_tiny_model_on_cuda():
    from tokenspeed.runtime import LLM, SamplingParams

    llm = LLM(None, device="cuda")
    outs = llm.generate(
        ["Hello, my name is", "The capital of France"],
        SamplingParams(temperature=0.0, max_tokens=16),
    )
    assert all(o.outputs[0].token_ids for o in outs)
    assert llm.engine.executor.num_device_pages > 0


def test_structured_outputs_on_cuda():
    """The grammar bitmask is unpacked and applied on the device; outputs match their grammar,
    and unconstrained rows of the same batch equal a run without the constrained ones."""
    pytest.importorskip("xgrammar")
    import json
    import re

    from tokenspeed.runtime import LLM, SamplingParams
    from tokenspeed.runtime.grammar import GrammarSpec

    llm = LLM(None, device="cuda")
    prompts = ["Hello, my name is", "The capital of France", "x"]
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
              "maximum": 9}}, "required": ["n"], "additionalProperties": False}  # fmt: skip
    plain = SamplingParams(temperature=0.0, max_tokens=12)
    regex = SamplingParams(temperature=1.0, max_tokens=30, seed=3,
                           grammar=GrammarSpec.regex("[a-z]{12}"))  # fmt: skip
    js = SamplingParams(temperature=1.0, max_tokens=40, seed=4,
                        grammar=GrammarSpec.json_schema(schema, any_whitespace=False))  # fmt: skip
    alone = llm.generate(prompts, plain)
    mixed = llm.generate(prompts * 3, [plain] * 3 + [regex] * 3 + [js] * 3)
    assert [o.outputs[0].token_ids for o in mixed[:3]] == [o.outputs[0].token_ids for o in alone]
    for o in mixed[3:6]:
        assert re.fullmatch("[a-z]{12}", o.outputs[0].text), o.outputs[0].text
    for o in mixed[6:]:
        assert 0 <= json.loads(o.outputs[0].text)["n"] <= 9


def test_dummy_qwen3_8b_generates_on_cuda():
    from tokenspeed.runtime import LLM, SamplingParams

    llm = LLM(
        "qwen3-8b",
        load_format="dummy",
        dtype="bfloat16",
        device="cuda",
        max_model_len=4096,
        gpu_memory_utilization=0.5,
    )
    prompts = [[int(t) for t in torch.randint(100, 1000, (n,))] for n in (17, 300, 64, 1000)]
    outs = llm.generate(
        prompts, SamplingParams(temperature=0.7, max_tokens=8, ignore_eos=True, seed=1)
    )
    assert [len(o.outputs[0].token_ids) for o in outs] == [8] * 4
    free, total = torch.cuda.mem_get_info()
    assert llm.engine.executor.kv_pool.size_bytes < 0.5 * total


def test_cuda_graph_decode_matches_eager(tmp_path):
    from runtime_helpers import make_prompts, make_tiny_checkpoint, run_without_scheduler

    from tokenspeed.runtime.model_executor import ExecutorConfig, ModelExecutor

    path = make_tiny_checkpoint("llama", tmp_path / "ll")
    prompts = make_prompts(count=5)
    common = dict(
        model_path=path, device="cuda", page_size=16, max_total_tokens=8192, max_num_seqs=16
    )
    graphed = ModelExecutor(ExecutorConfig(**common))
    eager = ModelExecutor(ExecutorConfig(**common, disable_cuda_graph=True))
    assert graphed.graph_runner is not None and eager.graph_runner is None
    a, la = run_without_scheduler(graphed, prompts, 12)
    b, lb = run_without_scheduler(eager, prompts, 12)
    assert a == b
    for x, y in zip(la, lb, strict=True):
        torch.testing.assert_close(torch.stack(x), torch.stack(y), atol=1e-4, rtol=0)


def test_ngram_speculative_decoding_on_cuda(tmp_path):
    """Drafted blocks verified by extend kernels give transformers' greedy tokens on CUDA
    (float32 tiny checkpoint), with drafts accepted."""
    from runtime_helpers import hf_greedy, hf_model, make_prompts, make_tiny_checkpoint

    from tokenspeed.runtime import LLM, SamplingParams

    path = make_tiny_checkpoint("qwen3", tmp_path / "q3")
    prompts = make_prompts()
    want, _ = hf_greedy(hf_model(path), prompts, 24)
    llm = LLM(str(path), device="cuda", page_size=16, max_total_tokens=8192,
              speculative_algorithm="NGRAM", speculative_num_draft_tokens=4)  # fmt: skip
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24))
    assert [o.outputs[0].token_ids for o in outs] == want
    assert llm.engine.executor.spec_accepted > 0


def test_a_deleted_engine_leaves_no_device_memory_behind():
    """Engines built and deleted in turn hold no more device memory than the first did: each
    graph runner once warmed up on a stream of its own, and cuBLAS kept that stream's
    workspace (32 MiB on Hopper) for the life of the process."""
    import gc

    from tokenspeed.runtime import LLM, SamplingParams

    def build_run_delete() -> int:
        llm = LLM(None, device="cuda", max_total_tokens=4096)  # a small pool: no sizing race
        assert llm.engine.executor.graph_runner is not None  # the path under test
        llm.generate(["Hello, my name is"], SamplingParams(temperature=0.0, max_tokens=4))
        del llm
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return torch.cuda.memory_allocated()

    gc.collect()  # whatever earlier tests left for the collector goes before the baseline
    build_run_delete()
    first = build_run_delete()
    assert build_run_delete() - first < 1 << 20
