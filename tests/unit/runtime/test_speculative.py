"""N-gram speculative decoding (`speculative_algorithm="NGRAM"`): the same tokens as plain
decoding, in fewer steps.

Verification samples each drafted position exactly as a one-token step would (same logits,
seed and output position), so greedy outputs still equal transformers' and seeded samples
equal the non-speculative engine's, through chunked prefill, retraction, prefix hits, stop
tokens and limits that fall inside a drafted block. Random tiny models repeat themselves
greedily, so drafts are accepted and the step count drops.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from runtime_helpers import KINDS, NUM_NEW, assert_logprobs_match

from tokenspeed.runtime import LLM, SamplingParams
from tokenspeed.runtime.config import ConfigError, build_server_args
from tokenspeed.runtime.drafting import Drafts, TokenHistory
from tokenspeed.runtime.grammar.spec import GrammarSpec
from tokenspeed.runtime.ngram_drafter import BUCKETS, NgramDrafter, ngram_buckets

GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_NEW, logprobs=0)
NGRAM = dict(speculative_algorithm="NGRAM", speculative_num_draft_tokens=4)


def make_llm(path, **kw) -> LLM:
    args = dict(device="cpu", page_size=4, max_num_seqs=8, max_total_tokens=4096, seed=0)
    args.update(kw)
    return LLM(str(path) if path is not None else None, **args)


def tokens_of(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def test_drafter_proposes_what_followed_the_latest_match():
    d = NgramDrafter(2)
    d.install(1, [5, 6, 7, 8, 9, 1, 2, 5, 6, 7])
    assert d.propose_one(1, 3).tolist() == [8, 9, 1]  # "5 6 7" was followed by 8 9 1
    d.append(1, np.array([3, 5, 6, 7]))
    assert d.propose_one(1, 2).tolist() == [3, 5]  # the latest occurrence wins
    d.install(0, [1, 2, 3, 4])
    assert d.propose_one(0, 4).tolist() == []  # nothing repeats
    d.install(0, [9, 4, 9, 4, 9])
    assert d.propose_one(0, 8).tolist() == [4, 9]  # at most what the history holds


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_outputs_match_transformers(checkpoints, prompts, references, kind):
    plain = make_llm(checkpoints[kind])
    spec = make_llm(checkpoints[kind], **NGRAM)
    outs = spec.generate(prompts, GREEDY)
    assert tokens_of(outs) == references[kind][0]
    ex = spec.engine.executor
    assert ex.spec_accepted > 0 and ex.spec_drafted >= ex.spec_accepted
    # a batch takes as many steps as its slowest request; alone, a request that repeats
    # itself finishes in fewer steps
    fewer = 0
    for prompt in prompts:
        before = (plain.engine.num_steps, spec.engine.num_steps)
        plain.generate([prompt], GREEDY)
        spec.generate([prompt], GREEDY)
        fewer += spec.engine.num_steps - before[1] < plain.engine.num_steps - before[0]
    assert fewer > 0
    # logprobs of the accepted drafts are the model's, as for one-token steps
    assert_logprobs_match(outs, references[kind][1])


def test_chunked_prefill_retraction_and_prefix_hits(checkpoints, prompts, references):
    ref = references["qwen3_moe"][0]
    chunked = make_llm(checkpoints["qwen3_moe"], chunked_prefill_size=16, **NGRAM)
    assert tokens_of(chunked.generate(prompts, GREEDY)) == ref
    # mixed steps (decodes beside prefill chunks) verify their blocks as an extend
    mixed = make_llm(checkpoints["qwen3_moe"], chunked_prefill_size=16, enable_mixed_batch=True,
                     max_num_seqs=4, **NGRAM)  # fmt: skip
    assert tokens_of(mixed.generate(prompts, GREEDY)) == ref
    assert mixed.engine.executor.spec_accepted > 0
    small = make_llm(checkpoints["qwen3_moe"], max_total_tokens=240, **NGRAM)
    outs = small.generate(prompts, GREEDY)
    assert tokens_of(outs) == ref
    assert small.engine.stats()["num_preemptions"] > 0
    cached = make_llm(checkpoints["qwen3"], enable_prefix_caching=True, **NGRAM)
    cached.generate(prompts[:3], GREEDY)
    again = cached.generate(prompts, GREEDY)
    assert tokens_of(again) == references["qwen3"][0]
    assert all(o.metrics.cache_tokens > 0 for o in again[:3])


def test_seeded_sampling_equals_plain_decoding(checkpoints, prompts):
    """Random sampling too: a position's draw depends on the seed and the position only."""
    params = [
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=NUM_NEW, seed=11, logprobs=2),
        SamplingParams(temperature=1.0, top_k=5, max_tokens=NUM_NEW, seed=3),
        SamplingParams(temperature=0.0, max_tokens=NUM_NEW, min_tokens=20),  # no drafts < 20
        SamplingParams(temperature=0.7, max_tokens=NUM_NEW, seed=4, presence_penalty=0.5),
    ]
    batch = [prompts[i % len(prompts)] for i in range(8)]
    sp = [params[i % len(params)] for i in range(8)]
    plain = make_llm(checkpoints["llama"]).generate(batch, sp)
    spec_llm = make_llm(checkpoints["llama"], **NGRAM)
    spec = spec_llm.generate(batch, sp)
    assert tokens_of(spec) == tokens_of(plain)
    for a, b in zip(spec, plain, strict=True):
        if b.outputs[0].logprobs:
            for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True):
                assert x.keys() == y.keys()
                assert max(abs(x[k] - y[k]) for k in x) < 1e-4
    assert spec_llm.engine.executor.spec_accepted > 0


def test_stops_and_limits_inside_a_drafted_block(checkpoints, prompts, references):
    """A stop token or the token limit met among accepted drafts ends the output there."""
    ref = references["qwen3"][0]
    spec = make_llm(checkpoints["qwen3"], **NGRAM)
    # stop at the 10th token of each reference output (its first occurrence)
    stops = [SamplingParams(temperature=0.0, max_tokens=NUM_NEW, stop_token_ids=[r[9]])
             for r in ref]  # fmt: skip
    outs = spec.generate(prompts, stops)
    for out, r in zip(outs, ref, strict=True):
        cut = r.index(r[9]) + 1
        assert out.outputs[0].token_ids == r[:cut] and out.outputs[0].finish_reason == "stop"
    for limit in (1, 5, 7):
        outs = spec.generate(prompts, SamplingParams(temperature=0.0, max_tokens=limit))
        assert tokens_of(outs) == [r[:limit] for r in ref]
        assert all(o.outputs[0].finish_reason == "length" for o in outs)


def test_verified_blocks_travel_as_columns_and_each_request_counts_its_drafts(
    checkpoints, prompts, references
):
    """A verified step reports each request once: its first token and its end as
    ``RequestUpdate``s, the blocks between as the ``block_rids``/``blocks`` columns; together
    they are transformers' tokens. A request's ``acc_rate`` / ``acc_len`` count the drafts
    verified for it and those its output kept (a block cut by its limit keeps fewer)."""
    spec = make_llm(checkpoints["llama"], **NGRAM)
    loop = spec.engine
    limits = [NUM_NEW, 7, NUM_NEW, 11]
    for i, (p, n) in enumerate(zip(prompts[:4], limits, strict=True)):
        loop.add_request(f"r{i}", p, SamplingParams(temperature=0.0, max_tokens=n))
    got: dict[str, list[int]] = {f"r{i}": [] for i in range(4)}
    stats = {}
    blocks = 0
    while loop.has_work():
        step = loop.step()
        special = {u.request_id: u for u in step.updates}
        assert not special.keys() & {*step.rids, *step.block_rids}  # once per step
        for rid, block in zip(step.block_rids, step.blocks, strict=True):
            assert got[rid] and block, "a first token travels as an update, with its cache hit"
            got[rid].extend(block)
            blocks += len(block) > 1
        for rid, token in zip(step.rids, step.tokens, strict=True):
            got[rid].append(token)
        for rid, u in special.items():
            assert (u.cached_tokens is not None) == (not got[rid])
            got[rid].extend(u.new_token_ids)
            assert u.finished == (len(got[rid]) == limits[int(rid[1])])
            if u.finished:
                stats[rid] = u.stats
    ref = references["llama"][0]
    assert [got[f"r{i}"] for i in range(4)] == [ref[i][:n] for i, n in enumerate(limits)]
    assert blocks > 0  # drafts were accepted, and their blocks went out as columns
    ex = loop.executor
    accepted = 0
    for s in stats.values():
        assert 0.0 <= s.acc_rate <= 1.0
        steps_after_first = (s.output_tokens - 1) / s.acc_len  # one per decode step
        accepted += round(s.output_tokens - 1 - steps_after_first)
    assert 0 < accepted <= ex.spec_accepted  # the executor also counts drafts cut off after
    assert max(s.acc_len for s in stats.values()) > 1.0


def test_grammar_rows_share_a_drafted_step():
    """A constrained request takes no drafts; its batch mates still do."""
    plain = make_llm(None, max_total_tokens=4096)
    spec = make_llm(None, max_total_tokens=4096, **NGRAM)
    prompt = "one two three one two three one two three one two"
    params = [
        SamplingParams(temperature=0.0, max_tokens=24),
        SamplingParams(temperature=0.0, max_tokens=24, grammar=GrammarSpec.regex("[a-z]{3,8}")),
    ]
    want = plain.generate([prompt, prompt], params)
    got = spec.generate([prompt, prompt], params)
    assert tokens_of(got) == tokens_of(want)
    assert spec.engine.executor.spec_drafted > 0


def test_speculative_options():
    assert build_server_args({"speculative_algorithm": "NGRAM"}).unsupported_options() == []
    assert build_server_args({"speculative_algorithm": "MTP"}).unsupported_options() == []
    (eagle,) = build_server_args({"speculative_algorithm": "EAGLE3"}).unsupported_options()
    assert "EAGLE3 is not" in eagle
    for algorithm in ("NGRAM", "MTP"):
        with pytest.raises(ConfigError, match="speculative_num_draft_tokens"):
            build_server_args({"speculative_algorithm": algorithm,
                               "speculative_num_draft_tokens": 1, "speculative_num_steps": 1})  # fmt: skip
    # MTP's chain is one draft per step (the recipes' steps = 1, draft tokens = 2)
    with pytest.raises(ConfigError, match="speculative_num_steps"):
        build_server_args({"speculative_algorithm": "MTP", "speculative_num_draft_tokens": 2})
    mtp = {"speculative_algorithm": "MTP", "speculative_num_steps": 1}
    assert build_server_args({**mtp, "speculative_num_draft_tokens": 2}).unsupported_options() == []


def _reference_proposal(tokens: list[int], count: int) -> list[int]:
    """The drafter's rule without an index: for match lengths 4, 3, 2 (longest first), the
    latest earlier occurrence of the last m tokens that some token follows."""
    for m in (4, 3, 2):
        if len(tokens) <= m:
            continue
        tail = tokens[-m:]
        for i in range(len(tokens) - m - 1, -1, -1):
            if tokens[i : i + m] == tail:
                return tokens[i + m : i + m + count]
    return []


def _index_reference(tokens: list[int], count: int, buckets: int) -> list[int]:
    """The same rule through a one-n-gram-per-bucket index, spelled out with a dict: each
    bucket remembers where the latest n-gram to land in it ended, and a lookup whose bucket
    holds another n-gram falls back to the next shorter match."""
    for m in (4, 3, 2):
        if len(tokens) <= m:
            continue
        latest = {}
        for end in range(m, len(tokens)):  # tokens[end - m : end], followed by tokens[end]
            latest[int(ngram_buckets(np.array(tokens[end - m : end]), buckets))] = end
        end = latest.get(int(ngram_buckets(np.array(tokens[-m:]), buckets)))
        if end is not None and tokens[end - m : end] == tokens[-m:]:
            return tokens[end : end + count]
    return []


def _collides(tokens: list[int], buckets: int) -> bool:
    """Whether two different n-grams of one match length share a bucket."""
    for m in (4, 3, 2):
        grams = {tuple(tokens[i : i + m]) for i in range(len(tokens) - m + 1)}
        if len({int(ngram_buckets(np.array(g), buckets)) for g in grams}) < len(grams):
            return True
    return False


@settings(max_examples=200, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(0, 3), max_size=30), min_size=1, max_size=4),
    steps=st.lists(
        st.lists(st.lists(st.integers(0, 3), max_size=3), min_size=4, max_size=4), max_size=8
    ),
    count=st.integers(1, 5),
    small=st.booleans(),
)
def test_drafter_matches_its_reference(prompts, steps, count, small):
    """Proposals for every slot after its install and after each step's appends (one
    vectorised index update and lookup over all slots) equal the index's rule; with tables
    too small to avoid collisions too (16 buckets), and with the default tables, where a
    history without collisions gets exactly the latest match of the longest suffix."""
    buckets = 16 if small else BUCKETS
    d = NgramDrafter(2, buckets=buckets)
    history = [list(p) for p in prompts]
    for slot, prompt in enumerate(prompts):
        d.install(slot, prompt)
    slots = np.arange(len(prompts))
    for gained in [[[]] * 4, *steps]:
        gained = gained[: len(prompts)]
        counts = np.array([len(g) for g in gained], dtype=np.int64)
        d.append_many(slots, counts, np.array([t for g in gained for t in g], dtype=np.int64))
        for slot, g in enumerate(gained):
            history[slot] += g
        got = d.propose(slots, slots, slots[:, None], count)
        assert got.lens.tolist() == [len(p) for p in got.per_request()]
        for slot, drafts in enumerate(got.per_request()):
            assert drafts.tolist() == _index_reference(history[slot], count, buckets)
            if not _collides(history[slot], buckets):
                assert drafts.tolist() == _reference_proposal(history[slot], count)


def test_drafter_index_follows_reinstalls_and_long_histories():
    """A slot's index is its current request's: a reinstalled slot forgets the old history,
    and a slot never installed has no drafts. On a long history a quote from far back is
    found (by the longest of its n-grams that kept its bucket)."""
    d = NgramDrafter(3)
    d.install(2, [1, 2, 3, 4, 5, 1, 2, 3])
    assert d.propose_one(2, 2).tolist() == [4, 5]
    d.install(2, [9, 8, 7, 9, 8])
    assert d.propose_one(2, 2).tolist() == [7, 9]  # nothing of 1 2 3 is left
    never = d.propose(np.array([1, 2, 9]), np.zeros(3), np.zeros((3, 1)), 2)  # 1, 9: no history
    assert never.lens.tolist() == [0, 2, 0] and never.tokens.tolist() == [7, 9]
    rng = np.random.default_rng(0)
    long = rng.integers(1, 32000, size=20000)
    long[15000:15040] = long[300:340]  # the model quotes tokens 300.. again
    d.install(0, long[:15010].tolist())
    assert d.propose_one(0, 3).tolist() == long[310:313].tolist()
    d.append(0, long[15010:15020])
    assert d.propose_one(0, 3).tolist() == long[320:323].tolist()


def test_mtp_and_ngram_drafts_share_one_layout():
    """``Drafts`` lays each request's tokens end to end; ``per_request`` splits them back."""
    drafts = Drafts(np.array([2, 0, 1]), np.array([5, 6, 7]))
    assert [x.tolist() for x in drafts.per_request()] == [[5, 6], [], [7]]
    assert Drafts(np.zeros(0, np.int64), np.zeros(0, np.int64)).per_request() == []


@settings(max_examples=100, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(0, 2**31 - 1), max_size=90), min_size=1, max_size=5),
    gains=st.lists(st.lists(st.integers(0, 4), min_size=5, max_size=5), max_size=30),
    never=st.integers(0, 5),
)
def test_token_history_holds_what_each_slot_gained(prompts, gains, never):
    """A step's appends (one scatter over all its requests) leave each slot's history equal to
    its prompt and its own gains in order, across growth of rows and width; a slot never
    installed keeps nothing, and reads of its length are 0."""
    h = TokenHistory(2)
    want: dict[int, list[int]] = {}
    for slot, prompt in enumerate(prompts):
        if slot != never:
            h.install(slot, prompt)
            want[slot] = list(prompt)
    slots = np.arange(5)
    for step, counts in enumerate(gains):
        counts = np.asarray(counts)
        tokens = np.arange(int(counts.sum())) + 1000 * step
        h.append_many(slots, counts, tokens)
        ends = np.cumsum(counts)
        for slot in want:
            want[slot] += tokens[ends[slot] - counts[slot] : ends[slot]].tolist()
    for slot in range(5):
        assert h.tokens(slot).tolist() == want.get(slot, [])
        assert h.lengths(np.array([slot]))[0] == len(want.get(slot, []))
    for slot, tokens in want.items():
        if tokens:
            positions = np.arange(len(tokens))
            assert h.gather(np.full(len(tokens), slot), positions).tolist() == tokens
