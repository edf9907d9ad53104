"""Workload generators: exact token lengths, shared-prefix structure, ShareGPT parsing,
multi-turn conversations that grow with the model's real answers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from tokenspeed_cli.bench import datasets as ds
from tokenspeed_cli.bench.errors import BenchError
from tokenspeed_cli.bench.tokens import TokenSampler, count_tokens, load_tokenizer


def test_sampler_text_has_exact_token_counts(sampler: TokenSampler, tokenizer: Tokenizer) -> None:
    rng = np.random.default_rng(3)
    for n in [1, 2, 7, 16, 100, 513]:
        assert count_tokens(tokenizer, sampler.text(n, rng)) == n
    assert sampler.text(0, rng) == ""


def test_random_requests_exact_lengths_and_shared_prefix(
    sampler: TokenSampler, tokenizer: Tokenizer
) -> None:
    reqs = ds.random_requests(sampler, 20, 50, 10, range_ratio=0.5, prefix_len=32, seed=1)
    assert len(reqs) == 20
    lens = {r.prompt_len for r in reqs}
    assert len(lens) > 1 and all(32 + 25 <= n <= 32 + 75 for n in lens)
    assert all(5 <= r.output_len <= 15 for r in reqs)
    prefix_ids = tokenizer.encode(reqs[0].prompt, add_special_tokens=False).ids[:32]
    for r in reqs:
        ids = tokenizer.encode(r.prompt, add_special_tokens=False).ids
        assert len(ids) == r.prompt_len
        assert ids[:32] == prefix_ids
        assert r.messages == [{"role": "user", "content": r.prompt}]


def test_random_requests_are_reproducible_by_seed(sampler: TokenSampler) -> None:
    a = ds.random_requests(sampler, 5, 20, 4, seed=7)
    b = ds.random_requests(sampler, 5, 20, 4, seed=7)
    c = ds.random_requests(sampler, 5, 20, 4, seed=8)
    assert [r.prompt for r in a] == [r.prompt for r in b]
    assert [r.prompt for r in a] != [r.prompt for r in c]


def test_random_range_ratio_must_be_below_one(sampler: TokenSampler) -> None:
    with pytest.raises(BenchError, match="range-ratio"):
        ds.random_requests(sampler, 2, 10, 4, range_ratio=1.0)


def test_shared_prefix_groups(sampler: TokenSampler, tokenizer: Tokenizer) -> None:
    reqs = ds.shared_prefix_requests(sampler, 3, 4, 40, 12, 9, seed=2)
    assert len(reqs) == 12
    systems = [r.messages[0]["content"] for r in reqs]
    for g in range(3):
        group = reqs[4 * g : 4 * g + 4]
        assert len({r.messages[0]["content"] for r in group}) == 1
        assert len({r.messages[1]["content"] for r in group}) == 4
    assert len(set(systems)) == 3
    for r in reqs:
        assert r.output_len == 9 and r.prompt_len == 52
        assert count_tokens(tokenizer, r.prompt) == 52
        assert count_tokens(tokenizer, r.messages[0]["content"]) == 40
        assert r.prompt == r.messages[0]["content"] + r.messages[1]["content"]
        assert [m["role"] for m in r.messages] == ["system", "user"]


def test_multi_turn_conversation_grows_with_answers(
    sampler: TokenSampler, tokenizer: Tokenizer
) -> None:
    sessions = ds.multi_turn_sessions(sampler, 2, 3, 30, 10, 5, seed=4)
    assert sessions[0].system == sessions[1].system  # shared tool docs
    assert sessions[0].user_messages != sessions[1].user_messages
    s = sessions[0]
    first = s.request_for_turn(0, tokenizer)
    assert [m["role"] for m in first.messages] == ["system", "user"]
    assert first.prompt_len == 40 and first.output_len == 5
    with pytest.raises(ValueError):
        s.request_for_turn(1, tokenizer)
    s.answers.append(" alpha beta")
    second = s.request_for_turn(1, tokenizer)
    assert second.messages[:2] == first.messages
    assert second.messages[2] == {"role": "assistant", "content": " alpha beta"}
    assert second.messages[3] == {"role": "user", "content": s.user_messages[1]}
    assert second.prompt.startswith(first.prompt)
    assert second.prompt_len == count_tokens(tokenizer, second.prompt)
    assert second.prompt_len >= first.prompt_len + 10
    s.answers.append(" gamma")
    third = s.request_for_turn(2, tokenizer)
    assert len(third.messages) == 6 and third.messages[:4] == second.messages
    assert third.prompt_len > second.prompt_len


def test_multi_turn_distinct_system_prompts(sampler: TokenSampler) -> None:
    sessions = ds.multi_turn_sessions(sampler, 3, 1, 20, 5, 5, shared_system_prompt=False)
    assert len({s.system for s in sessions}) == 3


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    return path


def test_sharegpt_reads_both_layouts_and_filters(tmp_path: Path, tokenizer: Tokenizer) -> None:
    long_q = " the quick brown fox jumps over the lazy dog" * 3
    data = [
        {"conversations": [{"from": "human", "value": long_q}, {"from": "gpt", "value": long_q}]},
        {
            "messages": [
                {"role": "user", "content": long_q},
                {"role": "assistant", "content": long_q},
            ]
        },
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": long_q}]},
        {"conversations": [{"from": "human", "value": long_q}]},
        {
            "conversations": [
                {"from": "system", "value": "be nice"},
                {"from": "human", "value": long_q},
                {"from": "gpt", "value": long_q},
            ]
        },  # fmt: skip
        "junk",
    ]
    reqs = ds.sharegpt_requests(tokenizer, _write(tmp_path, data), 10)
    n = count_tokens(tokenizer, long_q)
    assert len(reqs) == 3  # the system turn is skipped
    assert all(r.prompt == long_q and r.prompt_len == n and r.output_len == n for r in reqs)
    fixed = ds.sharegpt_requests(tokenizer, _write(tmp_path, data), 1, output_len=7)
    assert len(fixed) == 1 and fixed[0].output_len == 7


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "not found"),
        ("{not json", "not valid JSON"),
        ('{"a": 1}', "JSON list"),
        ('[{"conversations": []}]', "no usable conversations"),
    ],
)
def test_sharegpt_bad_files(
    tmp_path: Path, tokenizer: Tokenizer, content: str | None, message: str
) -> None:
    path = tmp_path / "data.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(BenchError, match=message):
        ds.sharegpt_requests(tokenizer, path, 5)


def test_load_tokenizer_errors(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(BenchError, match="cannot load tokenizer"):
        load_tokenizer(tmp_path)
