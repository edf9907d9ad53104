"""Sampling: masks against a plain reference, penalty definitions, seeds, distribution, logprobs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenspeed.runtime.sampling import SamplingParams, SamplingState, sample
from tokenspeed.runtime.sampling.processors import apply_penalties, min_p_mask, top_k_top_p_mask
from tokenspeed.runtime.sampling.rng import uniform_noise, unit_interval

CPU = torch.device("cpu")


def reference_keep(logits: list[float], top_k: int, top_p: float, min_p: float) -> set[int]:
    """Straightforward per-row definition of the kept token set."""
    order = sorted(range(len(logits)), key=lambda i: -logits[i])
    keep = order[:top_k] if top_k > 0 else order
    m = max(logits[i] for i in keep)
    z = sum(math.exp(logits[i] - m) for i in keep)
    probs = {i: math.exp(logits[i] - m) / z for i in keep}
    if top_p < 1.0:
        kept, mass = [], 0.0
        for i in keep:
            if mass >= top_p:
                break
            kept.append(i)
            mass += probs[i]
        keep = kept
    if min_p > 0:
        m = max(logits[i] for i in keep)
        z = sum(math.exp(logits[i] - m) for i in keep)
        p = {i: math.exp(logits[i] - m) / z for i in keep}
        top = max(p.values())
        keep = [i for i in keep if p[i] >= min_p * top]
    return set(keep)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    rows=st.integers(1, 6),
    vocab=st.integers(2, 40),
    data=st.data(),
)
def test_masks_match_reference(seed, rows, vocab, data):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen, dtype=torch.float64).float() * 3
    top_k = data.draw(st.lists(st.integers(0, vocab + 2), min_size=rows, max_size=rows))
    top_p = data.draw(
        st.lists(st.sampled_from([1.0, 0.9, 0.5, 0.2, 0.05]), min_size=rows, max_size=rows)
    )
    min_p = data.draw(st.lists(st.sampled_from([0.0, 0.05, 0.3]), min_size=rows, max_size=rows))
    p = torch.tensor([x if x < 1 else math.inf for x in top_p])
    masked = top_k_top_p_mask(logits, torch.tensor(top_k), p)
    masked = min_p_mask(masked, torch.tensor(min_p))
    for r in range(rows):
        ours = set(torch.isfinite(masked[r]).nonzero().flatten().tolist())
        assert ours == reference_keep(logits[r].tolist(), top_k[r], top_p[r], min_p[r])
        kept = torch.isfinite(masked[r])
        assert torch.equal(masked[r][kept], logits[r][kept])  # kept logits untouched


def test_penalties_follow_definitions():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5, -1.0]])
    counts = torch.tensor([[3, 1, 0, 0, 0]], dtype=torch.int32)  # generated tokens 0 x3, 1 x1
    prompt = torch.tensor([[False, False, True, False, True]])  # tokens 2 and 4 in the prompt
    out = apply_penalties(
        logits.clone(),
        counts,
        prompt,
        torch.tensor([2.0]),
        torch.tensor([0.5]),
        torch.tensor([0.25]),
    )
    expected = torch.tensor(
        [
            [
                2.0 / 2 - 0.25 * 3 - 0.5,  # output token: repetition, frequency and presence
                -2.0 * 2 - 0.25 * 1 - 0.5,
                1.0 / 2,  # prompt-only token: repetition only (OpenAI penalties count outputs)
                0.5,  # unseen: unchanged
                -1.0 * 2,
            ]
        ]
    )
    torch.testing.assert_close(out, expected)


def _state(
    params: list[SamplingParams], seeds: list[int], vocab: int, prompts=None
) -> SamplingState:
    state = SamplingState(len(params), vocab, CPU)
    for slot, (p, s) in enumerate(zip(params, seeds, strict=True)):
        state.install(slot, p, s, (prompts or [[]] * len(params))[slot], [])
    return state


def test_seeded_rows_reproduce_across_batches():
    vocab = 50
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(vocab, generator=gen)
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=20, seed=42)
    alone = _state([params], [42], vocab)
    tokens_alone = []
    for _ in range(20):
        b = alone.gather(np.array([0]))
        t = sample(base[None].clone(), b, alone).tokens
        alone.record(np.array([0]), b, t)
        tokens_alone.append(int(t[0]))
    others = [SamplingParams(temperature=1.0, seed=s) for s in range(5)]
    crowd = _state([*others, params], [0, 1, 2, 3, 4, 42], vocab)
    tokens_crowd = []
    for step in range(20):
        slots = np.array([3, 5, 0, 1] if step % 2 else [5, 2])  # different companions and rows
        logits = torch.randn(len(slots), vocab, generator=gen)
        logits[slots == 5] = base
        b = crowd.gather(slots)
        t = sample(logits, b, crowd).tokens
        crowd.record(slots, b, t)
        tokens_crowd.append(int(t[slots == 5][0]))
    assert tokens_crowd == tokens_alone
    assert len(set(tokens_alone)) > 1  # actually random, not a constant


def test_sampled_frequencies_follow_the_distribution():
    vocab, n = 6, 40_000
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0, 2.0])
    state = _state([SamplingParams(temperature=1.0)], [7], vocab)
    b = state.gather(np.zeros(n, dtype=np.int64))
    b.positions = torch.arange(n)  # n independent draws of one request
    tokens = sample(logits.expand(n, vocab).clone(), b, state).tokens
    freq = torch.bincount(tokens, minlength=vocab).float() / n
    torch.testing.assert_close(freq, logits.softmax(-1), atol=0.01, rtol=0)


def test_top_k_renormalises_over_the_kept_tokens():
    vocab, n = 6, 20_000
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0, 2.0])
    state = _state([SamplingParams(temperature=0.5, top_k=2)], [3], vocab)
    b = state.gather(np.zeros(n, dtype=np.int64))
    b.positions = torch.arange(n)
    tokens = sample(logits.expand(n, vocab).clone(), b, state).tokens
    freq = torch.bincount(tokens, minlength=vocab).float() / n
    expected = torch.zeros(vocab)
    expected[[5, 0]] = torch.tensor([2.0, 1.0]).div(0.5).softmax(-1)
    torch.testing.assert_close(freq, expected, atol=0.012, rtol=0)


def test_uniform_noise_is_in_open_interval_and_decorrelated():
    u = uniform_noise(torch.tensor([1, 1, 2]), torch.tensor([0, 1, 0]), 5000)
    assert (u > 0).all() and (u < 1).all()
    assert abs(u.mean().item() - 0.5) < 0.02
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])


def test_every_hash_maps_strictly_inside_the_unit_interval():
    """The extreme hashes too: a uniform of exactly 1.0 made an exponential of 0, whose token
    then won the race whatever its probability, or (masked) became a NaN argmax picked."""
    bits = torch.tensor([0, 1, 511, 512, 2**31, 2**32 - 512, 2**32 - 2, 2**32 - 1])
    u = unit_interval(bits)
    assert (u > 0).all() and (u < 1).all()
    exp = -torch.log(u)
    assert (exp > 0).all() and torch.isfinite(exp).all()
    masked = torch.tensor([float("-inf")]).expand(len(bits)) - exp.log()
    assert (masked == float("-inf")).all()  # never NaN, so never argmax's pick


def test_greedy_logprobs_and_min_tokens():
    vocab = 10
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(1))
    eos = int(logits[1].argmax())
    params = [
        SamplingParams(temperature=0.0, logprobs=3),
        SamplingParams(temperature=0.0, min_tokens=2),
        SamplingParams(temperature=0.0),
    ]
    state = SamplingState(3, vocab, CPU)
    for slot, p in enumerate(params):
        state.install(slot, p, 0, [], [], stop_ids=[eos])
    slots = np.arange(3)
    b = state.gather(slots)
    out = sample(logits.clone(), b, state)
    assert out.tokens[0] == logits[0].argmax() and out.tokens[2] == logits[2].argmax()
    assert out.tokens[1] != eos  # banned before min_tokens
    logp = logits.log_softmax(-1)
    torch.testing.assert_close(out.logprobs[0], logp[0, out.tokens[0]])
    top_vals, top_ids = logp[0].topk(3)
    assert torch.equal(out.top_ids[0], top_ids)
    torch.testing.assert_close(out.top_logprobs[0], top_vals)
    state.record(slots, b, out.tokens)
    state.record(slots, b, out.tokens)
    b = state.gather(slots)
    assert b.banned is None  # two tokens generated: EOS allowed again
    assert sample(logits.clone(), b, state).tokens[1] == eos


def test_logit_bias_per_row():
    """Each row gets its own biases (added to the logits, so +100 forces a token and -100
    removes it); rows without any are untouched, and logprobs stay the model's."""
    vocab = 16
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(3))
    top = logits.argmax(-1)
    params = [
        SamplingParams(temperature=0.0, logit_bias={7: 100.0}, logprobs=0),
        SamplingParams(temperature=0.0, logit_bias={int(top[1]): -100.0, 3: 0.5}),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, seed=9, logit_bias={11: 100.0}),
    ]
    state = SamplingState(4, vocab, CPU)
    for slot, p in enumerate(params):
        state.install(slot, p, p.seed or 0, [], [])
    out = sample(logits.clone(), state.gather(np.arange(4)), state)
    biased = logits[1].clone()
    biased[top[1]] -= 100.0
    biased[3] += 0.5
    assert out.tokens.tolist() == [7, int(biased.argmax()), int(top[2]), 11]
    torch.testing.assert_close(out.logprobs[0], logits[0].log_softmax(-1)[7])
    assert state.gather(np.array([2])).bias is None


def test_logit_bias_wire_form_and_validation():
    assert SamplingParams(logit_bias=[[5, 1.5], [2, -3]]).logit_bias == {5: 1.5, 2: -3.0}
    assert SamplingParams(logit_bias={"5": 1}).logit_bias == {5: 1.0}
    with pytest.raises(ValueError, match="logit_bias values"):
        SamplingParams(logit_bias={1: 101.0})
    with pytest.raises(ValueError, match="logit_bias keys"):
        SamplingParams(logit_bias={-1: 1.0})


def test_frequency_penalty_counts_update_after_each_step():
    vocab = 4
    state = _state([SamplingParams(temperature=0.0, frequency_penalty=2.0)], [0], vocab)
    logits = torch.tensor([[1.0, 0.9, 0.0, -1.0]])
    seen = []
    for _ in range(3):
        b = state.gather(np.array([0]))
        t = sample(logits.clone(), b, state).tokens
        state.record(np.array([0]), b, t)
        seen.append(int(t[0]))
    assert seen == [0, 1, 2]  # each pick is penalised on the next step


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-1), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(min_p=1.5), "min_p"),
        (dict(presence_penalty=3), "presence_penalty"),
        (dict(repetition_penalty=0), "repetition_penalty"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(min_tokens=5, max_tokens=2), "min_tokens"),
        (dict(logprobs=99), "logprobs"),
        (dict(seed=-1), "seed"),
    ],
)
def test_invalid_params_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_top_k_minus_one_means_disabled():
    assert SamplingParams(top_k=-1).top_k == 0
