"""The runner with an in-memory server: multi-turn sessions resend the real answers, turns
stay sequential, the concurrency cap holds across sessions, warm-ups are checked."""

from __future__ import annotations

import asyncio

import pytest
from bench_fake_openai import FakeServer
from tokenizers import Tokenizer

from tokenspeed_cli.bench import datasets as ds
from tokenspeed_cli.bench.errors import BenchError
from tokenspeed_cli.bench.runner import LoadShape, ServeTarget, prepare, run_workload
from tokenspeed_cli.bench.tokens import TokenSampler


def test_multi_turn_sessions(sampler: TokenSampler, tokenizer: Tokenizer) -> None:
    server = FakeServer(delay_s=0.01)
    sessions = ds.multi_turn_sessions(sampler, 3, 3, 20, 8, 4, seed=5)
    target = ServeTarget("http://x", "chat", transport=server.transport())
    done = []
    outcome = asyncio.run(run_workload(target, "m", sessions, tokenizer,
                                       LoadShape(max_concurrency=2), done.append))  # fmt: skip
    assert len(outcome.results) == 9 and len(done) == 9
    assert all(r.success for r in outcome.results)
    assert server.peak <= 2 and outcome.peak_concurrency == 2
    for i, s in enumerate(sessions):
        mine = [b for b in server.bodies if b["messages"][1]["content"] == s.user_messages[0]]
        assert [len(b["messages"]) for b in mine] == [2, 4, 6]  # turns in order
        assert s.answers == [r.generated_text for r in outcome.results[3 * i : 3 * i + 3]][:3]
        for turn, body in enumerate(mine):
            assistant = [m["content"] for m in body["messages"] if m["role"] == "assistant"]
            assert assistant == s.answers[:turn]  # the model's actual previous answers
            assert body["messages"][-1]["content"] == s.user_messages[turn]


def test_failed_turn_ends_its_session(sampler: TokenSampler, tokenizer: Tokenizer) -> None:
    sessions = ds.multi_turn_sessions(sampler, 2, 3, 10, 5, 4, seed=6)
    victim = sessions[1].user_messages[0]

    def fail(body: dict) -> int | None:
        return (
            500 if body["messages"][1]["content"] == victim and len(body["messages"]) == 4 else None
        )

    server = FakeServer(fail_when=fail)
    target = ServeTarget("http://x", "chat", transport=server.transport())
    outcome = asyncio.run(run_workload(target, "m", sessions, tokenizer, LoadShape()))
    assert [r.success for r in outcome.results] == [True, True, True, True, False, False]
    assert outcome.results[5].error == "not sent: turn 1 failed"
    assert len(server.bodies) == 5


def test_independent_requests_with_rate(sampler: TokenSampler, tokenizer: Tokenizer) -> None:
    server = FakeServer()
    reqs = ds.random_requests(sampler, 6, 12, 3, seed=1)
    target = ServeTarget("http://x", "completions", transport=server.transport())
    shape = LoadShape(request_rate=200.0, burstiness=1.0, seed=3)
    outcome = asyncio.run(run_workload(target, "m", reqs, tokenizer, shape))
    assert [b["prompt"] for b in server.bodies] == [r.prompt for r in reqs]  # arrival order
    assert all(b["max_tokens"] == 3 and b["model"] == "m" for b in server.bodies)
    assert outcome.duration_s > 0 and len(outcome.results) == 6


def test_prepare_resolves_model_and_checks_warmups(
    sampler: TokenSampler, tokenizer: Tokenizer
) -> None:
    warm = ds.random_requests(sampler, 2, 8, 2, seed=9)
    server = FakeServer()
    target = ServeTarget("http://x", "completions", transport=server.transport())
    assert asyncio.run(prepare(target, tokenizer, warm, None)) == "fake-model"
    assert len(server.bodies) == 2
    bad = ServeTarget("http://x", "completions",
                      transport=FakeServer(fail_when=lambda b: 404).transport())  # fmt: skip
    with pytest.raises(BenchError, match="warm-up request failed: HTTP 404"):
        asyncio.run(prepare(bad, tokenizer, warm, None))
