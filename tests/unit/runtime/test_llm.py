"""The offline LLM through the real C++ scheduler: parity with transformers in every regime.

Regimes: everything fits; a small chunked-prefill budget (prompts split over steps); a KV pool
too small for the batch (retraction, recompute and, with a host tier, write-back/load-back);
prefix-cache hits (asserted). Plus the API surface: text prompts, chat, stop strings, logprobs.
"""

from __future__ import annotations

import pytest
import torch
from runtime_helpers import KINDS, NUM_NEW, assert_logprobs_match

from tokenspeed.runtime import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_NEW, logprobs=0)


def make_llm(path, **kw) -> LLM:
    args = dict(device="cpu", page_size=4, max_num_seqs=8, max_total_tokens=4096, seed=0)
    args.update(kw)
    return LLM(str(path), **args)


def tokens_of(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("kind", KINDS)
def test_batch_matches_transformers(checkpoints, prompts, references, kind):
    llm = make_llm(checkpoints[kind], enable_prefix_caching=False)
    outs = llm.generate(prompts, GREEDY)
    ref_tokens, ref_logits = references[kind]
    assert tokens_of(outs) == ref_tokens
    assert_logprobs_match(outs, ref_logits)
    assert all(o.outputs[0].finish_reason == "length" for o in outs)


@pytest.mark.parametrize("kind", KINDS)
def test_chunked_prefill_matches_transformers(checkpoints, prompts, references, kind):
    llm = make_llm(checkpoints[kind], chunked_prefill_size=16, enable_prefix_caching=False)
    outs = llm.generate(prompts, GREEDY)
    assert tokens_of(outs) == references[kind][0]
    assert llm.engine.num_steps > NUM_NEW + 8  # prompts really were split over steps


@pytest.mark.parametrize("host_tier", [False, True], ids=["recompute", "host-tier"])
def test_retraction_matches_transformers(checkpoints, prompts, references, host_tier):
    kw = dict(max_total_tokens=240, enable_prefix_caching=host_tier)
    if host_tier:
        kw["host_kv_cache_memory"] = 4 << 20
    llm = make_llm(checkpoints["qwen3_moe"], **kw)
    outs = llm.generate(prompts, GREEDY)
    assert tokens_of(outs) == references["qwen3_moe"][0]
    assert llm.engine.stats()["num_preemptions"] > 0
    assert sum(o.metrics.preempt_count for o in outs) > 0
    ex = llm.engine.executor
    if host_tier:  # retracted KV went to the host and came back instead of being recomputed
        assert ex.pages_written_back > 0 and ex.pages_loaded_back > 0
    else:
        assert ex.pages_written_back == 0 and ex.host_pool is None


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_prefix_cache_hits_keep_parity(checkpoints, prompts, references, kind):
    llm = make_llm(checkpoints[kind], enable_prefix_caching=True)
    first = llm.generate(prompts[:4], GREEDY)
    second = llm.generate(prompts, GREEDY)  # repeats the first four and shares their prefixes
    assert tokens_of(first) == references[kind][0][:4]
    assert tokens_of(second) == references[kind][0]
    assert llm.engine.stats()["prefix_cache_hit_tokens"] > 0
    hits = [o.metrics.cache_tokens for o in second]
    assert all(h > 0 for h in hits[:4])  # whole earlier prompts (full pages) were reused
    assert max(hits) <= max(len(p) for p in prompts)


def test_text_chat_stop_strings_and_seeds():
    llm = LLM(None, device="cpu", max_total_tokens=2048)
    tok = llm.tokenizer
    assert tok is not None
    outs = llm.generate(
        ["Hello there", "Once upon a time"], SamplingParams(temperature=0.0, max_tokens=12)
    )
    for o in outs:
        assert o.prompt_token_ids == tok.encode(o.prompt)
        assert o.outputs[0].text == tok.decode(o.outputs[0].token_ids)
    same = llm.generate("Once upon a time", SamplingParams(temperature=0.0, max_tokens=12))[0]
    assert same.outputs[0].token_ids == outs[1].outputs[0].token_ids

    sp = SamplingParams(temperature=1.0, max_tokens=24, seed=5)
    a = llm.generate("Tell me", sp)[0].outputs[0]
    b = llm.generate(["x y z", "Tell me", "abc"], sp)[1].outputs[0]
    assert a.token_ids == b.token_ids

    text = a.text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    if stop.strip():
        cut = llm.generate(
            "Tell me", SamplingParams(temperature=1.0, max_tokens=24, seed=5, stop=[stop])
        )[0]
        assert cut.outputs[0].finish_reason == "stop"
        assert cut.outputs[0].text == text[: text.index(stop)]

    # a stop token ends the output without its text, special tokens kept or not (as in vLLM)
    token = a.token_ids[3]
    ended = llm.generate("Tell me", SamplingParams(temperature=1.0, max_tokens=24, seed=5,
                                                   stop_token_ids=[token]))[0].outputs[0]  # fmt: skip
    assert ended.finish_reason == "stop" and ended.token_ids == a.token_ids[:4]
    assert ended.text == tok.decode(a.token_ids[:3])
    kept = SamplingParams(temperature=1.0, max_tokens=300, seed=3, skip_special_tokens=False)
    eos = [o.outputs[0] for o in llm.generate(["Hello there"] * 4, kept)]
    assert any(c.finish_reason == "stop" for c in eos)
    assert all(tok.eos_token not in c.text for c in eos)

    conv = [{"role": "user", "content": "Say something."}]
    chat = llm.chat(conv, SamplingParams(temperature=0.0, max_tokens=8))[0]
    assert chat.prompt_token_ids == tok.encode_chat(conv)
    assert len(chat.outputs[0].token_ids) >= 1


def test_text_prompt_without_tokenizer_is_refused(checkpoints):
    llm = make_llm(checkpoints["llama"])
    with pytest.raises(ValueError, match="no tokenizer"):
        llm.generate("hello")
    with pytest.raises(ValueError, match="2 sampling params for 1 prompts"):
        llm.generate([[1, 2, 3]], [GREEDY, GREEDY])


def test_repetition_penalty_matches_transformers(checkpoints, prompts):
    """Greedy with a repetition penalty equals transformers' RepetitionPenaltyLogitsProcessor."""
    from runtime_helpers import hf_model

    path = checkpoints["llama"]
    ref = hf_model(path)
    want = []
    for p in prompts[:4]:
        with torch.no_grad():
            out = ref.generate(
                torch.tensor([p]),
                max_new_tokens=16,
                min_new_tokens=16,
                do_sample=False,
                repetition_penalty=1.5,
                pad_token_id=0,
            )
        want.append(out[0, len(p) :].tolist())
    llm = make_llm(path)
    sp = SamplingParams(temperature=0.0, max_tokens=16, repetition_penalty=1.5)
    got = tokens_of(llm.generate(prompts[:4], sp))
    assert got == want
    plain = tokens_of(llm.generate(prompts[:4], SamplingParams(temperature=0.0, max_tokens=16)))
    assert plain != want  # the penalty changed something


def test_top_logprobs_match_transformers(checkpoints, prompts, references):
    llm = make_llm(checkpoints["qwen3"])
    outs = llm.generate(
        prompts[:3], SamplingParams(temperature=0.0, max_tokens=NUM_NEW, logprobs=3)
    )
    for out, ref in zip(outs, references["qwen3"][1][:3], strict=True):
        for step, entry in enumerate(out.outputs[0].logprobs):
            vals, ids = ref[step].log_softmax(-1).topk(3)
            assert set(ids.tolist()) <= set(entry)  # sampled token + the top 3
            got = torch.tensor([entry[i] for i in ids.tolist()])
            torch.testing.assert_close(got, vals, atol=1e-4, rtol=0)
