"""The EventLoop's per-step protocol with the C++ scheduler, on a scripted (model-free) executor.

One ``ForwardResult`` per forward (never ``ExtendResult``), ``Finish`` only for the requests
the engine stops, stop conditions (EOS, stop ids, min_tokens, max_tokens, wide stop sets),
retraction and re-binding of pool slots, and the prefix-cache hit on a request's first update.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import tokenspeed.scheduler as ts
from tokenspeed.runtime.engine.event_loop import EventLoop
from tokenspeed.runtime.entrypoints.engine_core import EngineCore
from tokenspeed.runtime.model_executor import StepOutput
from tokenspeed.runtime.sampling import SamplingParams

VOCAB = 1000
FILLER = 5  # the token a script emits once it runs out


class ScriptedExecutor:
    """Returns each request's scripted tokens in order (then FILLER); no model at all."""

    def __init__(self, scripts: dict[str, list[int]], max_model_len: int = 256) -> None:
        self.scripts = scripts
        self.max_model_len = max_model_len
        self.hf_config = SimpleNamespace(vocab_size=VOCAB)
        self.installs: list[tuple[int, int]] = []  # (slot, outputs so far) per install

    def install_request(
        self, slot, params, seed, prompt_ids, output_ids, stop_ids=(), grammar=None
    ) -> None:
        self.installs.append((slot, len(output_ids)))

    def execute(self, op: Any) -> StepOutput:
        rows = np.flatnonzero(op.sample_mask)
        ids = [op.request_ids[i] for i in rows.tolist()]
        toks = [self._next(rid) for rid in ids]
        return StepOutput(rows, np.asarray(toks, dtype=np.int64))

    def _next(self, rid: str) -> int:
        script = self.scripts.setdefault(rid, [])
        return script.pop(0) if script else FILLER


class RecordingScheduler:
    """The real scheduler; every ``advance`` call's event type names are recorded."""

    def __init__(self, cfg: ts.SchedulerConfig) -> None:
        self._s = ts.Scheduler(cfg)
        self.calls: list[list[str]] = []
        self.forwards: list[tuple[int, int]] = []  # (forward_id, sampled requests)

    def next_execution_plan(self) -> Any:
        plan = self._s.next_execution_plan()
        if plan.forward is not None:
            self.forwards.append((plan.forward.forward_id, int(plan.forward.sample_mask.sum())))
        return plan

    def advance(self, events: list[Any]) -> None:
        self.calls.append([type(e).__name__ for e in events])
        self._s.advance(events)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._s, name)


def make_loop(scripts, *, pages=256, eos=(), page=4, batch=8, **cfg) -> EventLoop:
    ex = ScriptedExecutor(scripts)
    sched = RecordingScheduler(
        ts.SchedulerConfig(
            page_size=page,
            num_device_pages=pages,
            max_scheduled_tokens=cfg.pop("budget", 4096),
            max_batch_size=batch,
            max_model_len=ex.max_model_len,
            **cfg,
        )
    )
    return EventLoop(ex, sched, eos_token_ids=eos)  # type: ignore[arg-type]


def drain(loop: EventLoop, limit: int = 2000) -> tuple[dict[str, list[int]], dict[str, Any], list]:
    out: dict[str, list[int]] = {}
    finished: dict[str, Any] = {}
    every: list = []
    for _ in range(limit):
        if not loop.has_work():
            break
        for u in loop.step():
            every.append(u)
            out.setdefault(u.request_id, []).extend(u.new_token_ids)
            if u.finished:
                assert u.request_id not in finished
                finished[u.request_id] = u
    assert not loop.has_work()
    return out, finished, every


def prompt(seed: int, n: int = 10) -> list[int]:
    return np.random.default_rng(seed).integers(10, VOCAB, n).tolist()


def test_one_forward_result_per_forward_and_finish_only_for_stops() -> None:
    eos = 3
    scripts = {
        "eos": [7, 8, eos, 9],  # stops on its 3rd token
        "stop_id": [7, 42, 9],  # stops on a stop_token_id
        "min": [eos, eos, 11, eos],  # EOS banned until 3 tokens: stops on the 4th
        "ignore": [eos, eos, eos],  # ignore_eos: runs to max_tokens
        "len": [],  # runs to max_tokens
    }
    loop = make_loop(dict(scripts), eos=[eos])
    loop.add_request("eos", prompt(0), SamplingParams(max_tokens=20))
    loop.add_request("stop_id", prompt(1), SamplingParams(max_tokens=20, stop_token_ids=[42]))
    loop.add_request("min", prompt(2), SamplingParams(max_tokens=20, min_tokens=3))
    loop.add_request("ignore", prompt(3), SamplingParams(max_tokens=6, ignore_eos=True))
    loop.add_request("len", prompt(4), SamplingParams(max_tokens=4))
    out, finished, _ = drain(loop)
    assert out == {
        "eos": [7, 8, eos],
        "stop_id": [7, 42],
        "min": [eos, eos, 11, eos],
        "ignore": [eos, eos, eos, FILLER, FILLER, FILLER],
        "len": [FILLER] * 4,
    }
    reasons = {rid: u.finish_reason for rid, u in finished.items()}
    assert reasons == {
        "eos": "stop",
        "stop_id": "stop",
        "min": "stop",
        "ignore": "length",
        "len": "length",
    }
    sched = loop.scheduler
    assert all("ExtendResult" not in call for call in sched.calls)
    sampled_forwards = [f for f in sched.forwards if f[1]]
    # Every forward that sampled anything is reported by exactly one ForwardResult, first.
    assert len(sampled_forwards) == sum(c.count("ForwardResult") for c in sched.calls)
    assert all(c[0] == "ForwardResult" for c in sched.calls if "ForwardResult" in c)
    # One Finish per request the engine ended (the scheduler ends max-token requests itself
    # too; the engine's second Finish is harmless), nothing else.
    assert sum(c.count("Finish") for c in sched.calls) == 5
    assert not loop.requests and loop.scheduler.stats().num_decoding == 0


def test_wide_stop_sets_and_logprob_free_updates() -> None:
    stop_ids = list(range(100, 140))  # wider than the per-slot stop table
    loop = make_loop({"wide": [7, 8, 139, 9], "narrow": [7, 139, 9]}, eos=[3])
    loop.add_request("wide", prompt(0), SamplingParams(max_tokens=10, stop_token_ids=stop_ids))
    loop.add_request("narrow", prompt(1), SamplingParams(max_tokens=3))
    out, finished, every = drain(loop)
    assert out == {"wide": [7, 8, 139], "narrow": [7, 139, 9]}
    assert finished["wide"].finish_reason == "stop"
    assert finished["narrow"].finish_reason == "length"
    assert all(u.new_logprobs is None for u in every)


def test_cached_tokens_on_first_update_only() -> None:
    shared = prompt(7, 40)  # 10 full pages of 4
    loop = make_loop({})
    loop.add_request("a", shared + [11, 12], SamplingParams(max_tokens=4))
    _, first_run, every = drain(loop)
    loop.add_request("b", shared + [13, 14, 15], SamplingParams(max_tokens=4))
    _, second_run, every_b = drain(loop)
    first_a = [u for u in every if u.request_id == "a"]
    first_b = [u for u in every_b if u.request_id == "b"]
    assert first_a[0].cached_tokens == 0
    assert first_b[0].cached_tokens == 40  # the shared full pages
    assert all(u.cached_tokens is None for u in first_a[1:] + first_b[1:])
    assert second_run["b"].stats.cache_tokens == 40
    # The engine process's wire message: on the first item, and again with the final stats.
    core = EngineCore.__new__(EngineCore)
    core._top_k = {}
    items = [core._item(u) for u in first_b]
    assert items[0]["cached_tokens"] == 40
    assert all("cached_tokens" not in it for it in items[1:-1])
    assert items[-1]["cached_tokens"] == 40 and items[-1]["finish"] == "length"


def test_cached_tokens_when_finishing_on_the_first_token() -> None:
    loop = make_loop({})
    loop.add_request("a", prompt(3, 12), SamplingParams(max_tokens=1))
    _, finished, every = drain(loop)
    assert len(every) == 1 and every[0].finished and every[0].cached_tokens == 0


@pytest.mark.parametrize("mixed", [False, True])
def test_retraction_rebinds_slots_and_outputs_stay_whole(mixed: bool) -> None:
    # A pool too small for all of them at full length: requests are retracted and resumed,
    # possibly in other slots, while the per-slot output counts stay right.
    n, max_tokens = 6, 30
    scripts = {f"r{i}": list(range(20 + i, 20 + i + max_tokens)) for i in range(n)}
    loop = make_loop(
        {k: list(v) for k, v in scripts.items()},
        pages=40,
        batch=4,
        budget=16,
        enable_mixed_batch=mixed,
        enable_prefix_cache=False,
    )
    for i in range(n):
        loop.add_request(f"r{i}", prompt(i, 12), SamplingParams(max_tokens=max_tokens))
    out, finished, _ = drain(loop)
    assert out == scripts
    assert all(u.finish_reason == "length" for u in finished.values())
    assert loop.scheduler.stats().num_preemptions > 0
    if not mixed:  # here a retracted request resumes in a slot another one used meanwhile
        assert any(k > 0 for _, k in loop.executor.installs)


def test_abort_between_steps_frees_the_slot() -> None:
    loop = make_loop({}, batch=2)
    for i in range(3):
        loop.add_request(f"r{i}", prompt(i), SamplingParams(max_tokens=8))
    early = [u for _ in range(2) for u in loop.step()]
    assert {u.request_id for u in early} == {"r0", "r1"}  # r2 waits for a slot
    loop.abort_request("r0")
    out, finished, _ = drain(loop)
    assert finished["r0"].finish_reason == "abort"
    assert len(out["r1"]) == 6 and out["r2"] == [FILLER] * 8
    assert not loop._slot_live.any()
