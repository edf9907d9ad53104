"""Structured outputs: grammar specs, the token bitmask, and constrained generation end to end.

Generation runs the embedded tiny model (random weights) through the real scheduler, so the
model itself has no wish to produce JSON or digits: every output that matches is the grammar's
doing.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from tokenspeed.runtime import LLM, SamplingParams
from tokenspeed.runtime.grammar import GrammarSpec
from tokenspeed.runtime.grammar.backend import GrammarError, vocab_metadata
from tokenspeed.runtime.sampling import SamplingState, sample
from tokenspeed.runtime.sampling.processors import forbidden_tokens, grammar_mask

xgr = pytest.importorskip("xgrammar")

PROMPTS = ["Hello there", "The answer is", "x", "Once upon a time, in a land far away"]
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["answer", "n", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(None, device="cpu", max_total_tokens=4096, max_num_seqs=8)


def texts(outs) -> list[tuple[str, str]]:
    return [(o.outputs[0].text, o.outputs[0].finish_reason) for o in outs]


# ---- specs and the bitmask (pure) ----------------------------------------------------------


def test_spec_wire_form_round_trips():
    for spec in [
        GrammarSpec.json_schema(SCHEMA, any_whitespace=False),
        GrammarSpec.json_object(),
        GrammarSpec.regex(r"\d+"),
        GrammarSpec.choice(["a", 'say "hi"']),
        GrammarSpec.grammar('root ::= "x"'),
    ]:
        assert GrammarSpec.coerce(spec.to_dict()) == spec
    assert json.loads(GrammarSpec.json_schema(SCHEMA).value) == SCHEMA
    assert SamplingParams(grammar={"kind": "regex", "value": "a"}).grammar == GrammarSpec.regex("a")
    with pytest.raises(ValueError, match="unknown grammar kind"):
        GrammarSpec("yaml", "")
    with pytest.raises(ValueError, match="non-empty list"):
        GrammarSpec.choice([])
    with pytest.raises(ValueError):
        GrammarSpec.coerce({"kind": "regex", "pattern": "a"})


@pytest.mark.parametrize(
    ("tokenizer_json", "want"),
    [
        ({"decoder": {"type": "ByteLevel"}}, ("BYTE_LEVEL", False)),
        (
            {
                "normalizer": {
                    "type": "Sequence",
                    "normalizers": [
                        {"type": "Prepend", "prepend": "\u2581"},
                        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
                    ],
                },
                "decoder": {
                    "type": "Sequence",
                    "decoders": [{"type": "Replace"}, {"type": "ByteFallback"}, {"type": "Fuse"}],
                },
            },
            ("BYTE_FALLBACK", True),
        ),
        (
            {
                "pre_tokenizer": {"type": "Metaspace", "prepend_scheme": "never"},
                "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}]},
            },
            ("BYTE_FALLBACK", False),
        ),
        ({"decoder": {"type": "WordPiece"}}, ("RAW", False)),
        ({}, ("RAW", False)),
    ],
    ids=["byte-level", "sentencepiece-prepend", "sentencepiece-no-prefix", "wordpiece", "none"],
)
def test_vocab_metadata_reads_the_decoder(tokenizer_json, want):
    assert vocab_metadata(tokenizer_json) == want


@pytest.mark.parametrize("vocab", [31, 32, 100, 1000])
@pytest.mark.parametrize("rows", [[0, 2, 4], [0, 1, 2, 3, 4]], ids=["some-rows", "all-rows"])
def test_grammar_mask_matches_xgrammar(vocab, rows):
    gen = torch.Generator().manual_seed(vocab)
    words = (vocab + 31) // 32
    index = torch.tensor(rows)
    bitmask = torch.randint(
        -(2**31), 2**31 - 1, (len(rows), words), generator=gen, dtype=torch.int32
    )
    logits = torch.randn(5, vocab, generator=gen)
    want, full = logits.clone(), torch.full((5, words), -1, dtype=torch.int32)
    full[index] = bitmask  # xgrammar's layout: one bitmask row per logits row
    xgr.apply_token_bitmask_inplace(want, full, indices=rows, backend="torch_native")
    got = grammar_mask(logits.clone(), index, bitmask)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    bit = (bitmask[1, 7 // 32] >> (7 % 32)) & 1
    assert bool(forbidden_tokens(bitmask, vocab)[1, 7]) != bool(bit)


class OnlyToken:
    """A stand-in matcher that allows one token (a grammar at its end: only its stop token)."""

    masks = True

    def __init__(self, token: int) -> None:
        self.token = token

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row] = 0
        bitmask[row, self.token // 32] = 1 << (self.token % 32)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_grammar_outranks_a_min_tokens_ban(temperature):
    """Row 0's grammar allows only its stop token, which min_tokens bans: the grammar wins.
    Row 1 (no grammar) keeps the ban."""
    state = SamplingState(2, 64, torch.device("cpu"))
    params = SamplingParams(temperature=temperature, min_tokens=4)
    state.install(0, params, 1, [1, 2], [], stop_ids=[37], grammar=OnlyToken(37))  # type: ignore[arg-type]
    state.install(1, params, 2, [1, 2], [], stop_ids=[37])
    logits = torch.full((2, 64), -5.0)
    logits[:, 37] = 5.0
    batch = state.gather(np.array([0, 1]))
    tokens = sample(logits, batch, state).tokens.tolist()
    assert tokens[0] == 37 and tokens[1] != 37


# ---- constrained generation ----------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_regex_choice_and_grammar_outputs_match(llm, temperature):
    cases = [
        (GrammarSpec.regex(r"[0-9]{3}-[a-z]{2}"), lambda t: re.fullmatch(r"[0-9]{3}-[a-z]{2}", t)),
        (GrammarSpec.choice(["yes", "no", "maybe so"]), lambda t: t in ("yes", "no", "maybe so")),
        (GrammarSpec.grammar('root ::= "(" [a-c]{1,4} ")"'), lambda t: re.fullmatch(r"\([a-c]{1,4}\)", t)),
    ]  # fmt: skip
    for spec, matches in cases:
        sp = SamplingParams(temperature=temperature, max_tokens=40, grammar=spec, seed=7)
        for text, reason in texts(llm.generate(PROMPTS, sp)):
            assert reason == "stop", (spec, text)
            assert matches(text), (spec, text)


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_json_schema_outputs_parse_and_conform(llm, temperature):
    spec = GrammarSpec.json_schema(SCHEMA, any_whitespace=False)
    sp = SamplingParams(temperature=temperature, max_tokens=60, grammar=spec, seed=3)
    for text, reason in texts(llm.generate(PROMPTS, sp)):
        assert reason == "stop", text
        value = json.loads(text)
        assert set(value) == {"answer", "n", "ok"}
        assert value["answer"] in ("yes", "no") and 0 <= value["n"] <= 99
        assert isinstance(value["ok"], bool)


def test_json_object_is_an_object(llm):
    sp = SamplingParams(temperature=1.0, max_tokens=80, grammar=GrammarSpec.json_object(), seed=1)
    outs = llm.generate(PROMPTS * 2, sp)
    for text, reason in texts(outs):
        assert text.lstrip().startswith("{")
        if reason == "stop":
            assert isinstance(json.loads(text), dict)
    assert any(reason == "stop" for _, reason in texts(outs))


def test_constrained_rows_leave_their_batch_mates_alone(llm):
    plain = SamplingParams(temperature=0.0, max_tokens=12)
    alone = llm.generate(PROMPTS, plain)
    constrained = SamplingParams(
        temperature=0.0, max_tokens=12, grammar=GrammarSpec.regex("[0-9]+")
    )
    mixed = llm.generate(PROMPTS + PROMPTS, [plain] * len(PROMPTS) + [constrained] * len(PROMPTS))
    assert [o.outputs[0].token_ids for o in mixed[: len(PROMPTS)]] == [
        o.outputs[0].token_ids for o in alone
    ]
    assert all(o.outputs[0].text.isdigit() for o in mixed[len(PROMPTS) :])


def test_logprobs_stay_the_models(llm):
    """Logprobs report the model's own distribution, not the masked one (as vLLM does)."""
    spec = GrammarSpec.regex("[0-9]{4}")
    sp = SamplingParams(temperature=0.0, max_tokens=4, logprobs=5, grammar=spec)
    constrained = llm.generate("Hello there", sp)[0].outputs[0]
    free = llm.generate("Hello there", SamplingParams(temperature=0.0, max_tokens=1, logprobs=5))
    raw_first = free[0].outputs[0].logprobs[0]
    assert constrained.text.isdigit()
    for token, logprob in raw_first.items():  # the model's top 5, whatever the grammar allows
        assert constrained.logprobs[0][token] == pytest.approx(logprob, abs=1e-6)
    sampled = constrained.token_ids[0]
    if sampled not in raw_first:
        assert constrained.logprobs[0][sampled] < min(raw_first.values())


def test_grammar_wins_over_min_tokens_and_ignore_eos(llm):
    choice = GrammarSpec.choice(["yes", "no"])
    for extra in ({"min_tokens": 8}, {"ignore_eos": True}):
        sp = SamplingParams(temperature=0.0, max_tokens=30, grammar=choice, **extra)
        outs = llm.generate(PROMPTS, sp)
        for text, reason in texts(outs):
            assert (text, reason) in (("yes", "stop"), ("no", "stop")), extra
        # the grammar ended on the model's EOS, not on a token sampled from nothing
        assert all(o.outputs[0].token_ids[-1] in llm.engine.eos_token_ids for o in outs)


def test_grammar_state_survives_retraction(llm):
    """A KV pool too small for the batch retracts requests mid-output; each resumes where its
    grammar left off, and (seeded) samples exactly what an unretracted run samples."""
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 1000, size=int(rng.integers(30, 60))).tolist() for _ in range(8)]
    sp = SamplingParams(
        temperature=1.0, max_tokens=60, grammar=GrammarSpec.regex("[a-z]{100}"), seed=11
    )
    small = LLM(None, device="cpu", max_total_tokens=200, page_size=4, max_num_seqs=8,
                enable_prefix_caching=False)  # fmt: skip
    outs = small.generate(prompts, sp)
    assert small.engine.stats()["num_preemptions"] > 0
    for text, reason in texts(outs):
        assert re.fullmatch(r"[a-z]{100}", text) and reason == "stop", text
    roomy = llm.generate(prompts, sp)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in roomy]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (GrammarSpec("json_schema", '{"type": "nope"}'), "invalid json_schema"),
        (GrammarSpec("json_schema", '{"type": '), "invalid json_schema"),
        (GrammarSpec.regex("([a-"), "invalid regex"),
        (GrammarSpec.grammar("root ::= undefined_rule"), "invalid grammar"),
    ],
)
def test_bad_grammars_are_refused_at_submit(llm, spec, message):
    with pytest.raises(GrammarError, match=message):
        llm.engine.add_request("bad", [1, 2, 3], SamplingParams(grammar=spec))
    assert "bad" not in llm.engine.requests
    out = llm.generate("still fine", SamplingParams(temperature=0.0, max_tokens=3))[0]
    assert len(out.outputs[0].token_ids) == 3


def test_finished_requests_release_their_matchers(llm):
    """A finished request's matcher leaves its slot, so later steps build no bitmask for it."""
    spec = GrammarSpec.choice(["yes", "no"])
    llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=5, grammar=spec))
    state = llm.engine.executor.sampling
    assert not state.has_grammar.any()
    assert all(g is None for g in state.grammar)
    batch = state.gather(np.arange(len(PROMPTS)))
    assert batch.grammar_mask is None and batch.grammars is None


# ---- compiling in the background (the server's mode) ---------------------------------------


@pytest.fixture
def background_llm():
    llm = LLM(None, device="cpu", max_total_tokens=4096, max_num_seqs=8)
    llm.engine.compile_grammars_in_background = True
    yield llm
    llm.engine.grammar_backend.close()


def test_new_grammars_compile_while_other_requests_run(background_llm):
    """A request with a new grammar waits off the scheduler until compiled; its batch mates
    run meanwhile and decode what they decode alone."""
    llm = background_llm
    plain = SamplingParams(temperature=0.0, max_tokens=10)
    alone = llm.generate(PROMPTS, plain)
    spec = GrammarSpec.json_schema(SCHEMA, any_whitespace=False)
    assert llm.engine.grammar_backend.ready(spec) is None
    sp = SamplingParams(temperature=0.0, max_tokens=60, grammar=spec)
    mixed = llm.generate(PROMPTS + PROMPTS, [plain] * len(PROMPTS) + [sp] * len(PROMPTS))
    assert [o.outputs[0].token_ids for o in mixed[: len(PROMPTS)]] == [
        o.outputs[0].token_ids for o in alone
    ]
    for text, reason in texts(mixed[len(PROMPTS) :]):
        assert reason == "stop" and json.loads(text)["answer"] in ("yes", "no")
    assert llm.engine.grammar_backend.ready(spec) is not None  # compiled once, kept
    assert not llm.engine._compiling


def test_a_grammar_failing_in_the_background_ends_its_request_with_the_error(background_llm):
    engine = background_llm.engine
    engine.add_request("bad", [1, 2, 3], SamplingParams(grammar=GrammarSpec.regex("(a")))
    assert "bad" in engine.requests  # accepted; the compile has not run yet
    updates = []
    while engine.has_work():
        updates += engine.step()
    (update,) = [u for u in updates if u.request_id == "bad"]
    assert update.finished and "invalid regex" in (update.error or "")
    assert "bad" not in engine.requests and not engine._compiling
    with pytest.raises(ValueError, match="invalid regex"):  # the offline API raises it
        background_llm.generate("x", SamplingParams(grammar=GrammarSpec.regex("(b")))


def test_aborting_a_request_while_its_grammar_compiles(background_llm):
    engine = background_llm.engine
    engine.add_request("gone", [1, 2, 3], SamplingParams(grammar=GrammarSpec.regex("[xyz]{9}")))
    engine.abort_request("gone")
    updates = []
    while engine.has_work():
        updates += engine.step()
    assert [(u.request_id, u.finish_reason) for u in updates] == [("gone", "abort")]
    assert not engine.requests and not engine._compiling
    assert engine.stats()["num_unfinished"] == 0


def test_stop_ids_past_the_vocabulary_are_left_out():
    """A shrunk model may keep its real EOS id beyond the shrunk vocabulary: the grammar ends on
    the ids that exist instead of failing (which, in the engine, would fail the request)."""
    from tokenspeed.runtime.grammar.backend import GrammarBackend
    from tokenspeed.runtime.tiny_model import ensure_tiny_model

    backend = GrammarBackend(ensure_tiny_model(), 1024, [2, 151645])
    assert backend.stop_token_ids == [2]
    grammar = backend.matcher(GrammarSpec.choice(["ok"]), [2, 151645])
    assert all(grammar.accept(t) for t in [*_ids("ok"), 2]) and grammar.finished


def _ids(text: str) -> list[int]:
    from tokenspeed.runtime.tiny_model import ensure_tiny_model
    from tokenspeed.runtime.tokenizer import Tokenizer

    return Tokenizer.from_dir(ensure_tiny_model()).encode(text, add_special_tokens=False)


# ---- thinking models: the grammar holds the answer after the thinking block -----------------

OPEN, CLOSE = 10, 11  # "(" and ")" in the tiny vocabulary stand in for <think> and </think>


def thinking_backend(starts_thinking: bool):
    from tokenspeed.runtime.grammar.backend import GrammarBackend, ThinkTokens
    from tokenspeed.runtime.tiny_model import ensure_tiny_model

    backend = GrammarBackend(ensure_tiny_model(), 1024, [2])
    backend.compile(GrammarSpec.regex("[0-9]{2}"))  # builds the compiler
    backend.think = ThinkTokens(OPEN, CLOSE, starts_thinking)
    return backend


def allowed(grammars, row: int) -> set[int]:
    from tokenspeed.runtime.grammar.backend import fill_bitmasks

    mask = torch.full((len(grammars), 32), -1, dtype=torch.int32)
    fill_bitmasks(grammars, mask)
    return {t for t in range(1024) if (int(mask[row, t // 32]) >> (t % 32)) & 1}


def test_a_model_that_may_think_first_gets_the_grammar_after_it():
    backend = thinking_backend(starts_thinking=False)
    spec = GrammarSpec.regex("[0-9]{2}")
    digit = _ids("7")[0]
    g = backend.matcher(spec, [2])
    first = allowed([g], 0)
    assert OPEN in first and digit in first and CLOSE not in first and _ids("a")[0] not in first
    assert g.accept(OPEN) and g.phase == "thinking"
    assert allowed([g], 0) == set(range(1024))  # the thinking block is free text
    assert g.accept(_ids("a")[0]) and g.accept(CLOSE) and g.phase == "active"
    after = allowed([g], 0)
    assert digit in after and OPEN not in after and CLOSE not in after
    assert all(g.accept(t) for t in [digit, digit, 2]) and g.finished
    # answering at once: the grammar holds from the first token, no block can open later
    direct = backend.matcher(spec, [2])
    assert direct.accept(digit) and direct.phase == "active" and OPEN not in allowed([direct], 0)


def test_rows_in_different_phases_fill_together():
    backend = thinking_backend(starts_thinking=True)  # DeepSeek-R1: the output starts thinking
    spec = GrammarSpec.regex("[0-9]{2}")
    thinking, answering = backend.matcher(spec, [2]), backend.matcher(spec, [2])
    assert thinking.phase == "thinking" and answering.accept(CLOSE)
    grammars = [answering, thinking, answering]
    assert allowed(grammars, 1) == set(range(1024))
    assert allowed(grammars, 0) == allowed(grammars, 2) == allowed([answering], 0)
    assert _ids("7")[0] in allowed(grammars, 0) and CLOSE not in allowed(grammars, 0)


def test_generation_thinks_freely_then_answers_in_the_grammar():
    llm = LLM(None, device="cpu", max_total_tokens=4096, max_num_seqs=8)
    llm.engine.grammar_backend = thinking_backend(starts_thinking=True)
    sp = SamplingParams(temperature=0.0, max_tokens=20, logit_bias={CLOSE: 100.0},
                        grammar=GrammarSpec.regex("[0-9]{3}"))  # fmt: skip
    for text, reason in texts(llm.generate(PROMPTS, sp)):
        # ")" ends the (empty) thinking block at once; after it, the bias cannot beat the mask
        assert re.fullmatch(r"\)[0-9]{3}", text) and reason == "stop", text


def test_a_request_that_turned_thinking_off_is_held_from_its_first_token():
    """Hybrid models (Qwen3 ``enable_thinking``, Kimi K2 / DeepSeek-V3.1 ``thinking``): with
    thinking off the output is the answer, so no free thinking block comes first."""
    backend = thinking_backend(starts_thinking=True)
    spec = GrammarSpec.regex("[0-9]{2}")
    g = backend.matcher(spec, [2], thinking=False)
    assert g.phase == "active" and allowed([g], 0) == allowed(
        [backend.matcher(spec, [2], False)], 0
    )
    assert CLOSE not in allowed([g], 0) and _ids("7")[0] in allowed([g], 0)
    llm = LLM(None, device="cpu", max_total_tokens=4096, max_num_seqs=8)
    llm.engine.grammar_backend = backend
    sp = SamplingParams(temperature=0.0, max_tokens=20, logit_bias={CLOSE: 100.0},
                        grammar=GrammarSpec.regex("[0-9]{3}"), thinking=False)  # fmt: skip
    for text, reason in texts(llm.generate(PROMPTS, sp)):
        assert re.fullmatch(r"[0-9]{3}", text) and reason == "stop", text
