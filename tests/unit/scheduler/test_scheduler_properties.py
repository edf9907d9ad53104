"""Property tests: random workloads against a fake executor that simulates KV content.

After every step the harness checks (see scheduler_harness.FakeEngine.check_invariants):
each page is free or owned by exactly one owner; the page counts of stats() add up; a prefix
hit is only reported for a prefix another request really had, and every forward reads back
exactly its own tokens from the pages its block table names; replaying the KV events yields
exactly the tree's blocks on each tier. Every bounded workload must finish.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scheduler_harness import FakeEngine

import tokenspeed.scheduler as ts


@dataclass
class Arrival:
    step: int
    stem: int
    suffix: int
    max_new: int
    priority: int


@st.composite
def configs(draw: st.DrawFn, tiny: bool = False) -> ts.SchedulerConfig:
    prefix_cache = draw(st.booleans()) if not tiny else True
    host = draw(st.sampled_from([0, 0, 4, 12, 48])) if prefix_cache else 0
    return ts.SchedulerConfig(
        page_size=draw(st.sampled_from([1, 2, 4, 8])),
        num_device_pages=draw(st.integers(4, 10) if tiny else st.integers(6, 48)),
        num_host_pages=host,
        max_scheduled_tokens=draw(st.integers(1, 48)),
        max_batch_size=draw(st.integers(1, 8)),
        max_model_len=draw(st.sampled_from([None, None, 24, 40])),
        enable_prefix_cache=prefix_cache,
        enable_mixed_batch=draw(st.booleans()),
        enable_kv_events=True,
        decode_input_tokens=draw(st.sampled_from([1, 1, 1, 2, 3])),
    )


arrivals = st.lists(
    st.builds(
        Arrival,
        step=st.integers(0, 30),
        stem=st.integers(0, 2),
        suffix=st.integers(0, 10),
        max_new=st.integers(1, 14),
        priority=st.sampled_from([0, 0, 0, 1]),
    ),
    min_size=1,
    max_size=20,
)


def run_workload(
    cfg: ts.SchedulerConfig, work: list[Arrival], seed: int, finish_p: float, abort_p: float
) -> FakeEngine:
    rng = random.Random(seed)
    eng = FakeEngine(ts.Scheduler(cfg), rng)
    # Shared stems make prefixes collide; a 3-token vocabulary makes generated tokens collide.
    stems = [[rng.randrange(3) for _ in range(rng.randint(1, 20))] for _ in range(3)]
    pending = sorted(enumerate(work), key=lambda iw: iw[1].step)
    step = 0
    while pending or eng.sched.has_unfinished():
        while pending and pending[0][1].step <= step:
            i, a = pending.pop(0)
            tokens = stems[a.stem] + [rng.randrange(3) for _ in range(a.suffix)]
            try:
                eng.submit(f"r{i}", tokens, a.max_new, a.priority)
            except ValueError:
                pages = -(-(len(tokens) + a.max_new + cfg.decode_input_tokens - 1) // cfg.page_size)
                limit = eng.max_model_len
                assert len(tokens) + a.max_new > limit or pages > cfg.num_device_pages
        eng.step(finish_prob=finish_p, abort_prob=abort_p)
        step += 1
        assert step < 5_000, "bounded workload did not finish (starvation or deadlock)"
    return eng


def check_outcome(eng: FakeEngine) -> None:
    for rid, t in eng.requests.items():
        assert t.finished, rid
        if t.finished_by == "length":
            assert t.outputs == t.max_new or len(t.tokens) >= eng.max_model_len
    st_ = eng.sched.stats()
    assert st_.device_pages_active == 0 and st_.num_cache_ops_in_flight == 0
    assert st_.num_waiting == st_.num_prefilling == st_.num_decoding == st_.num_retracted == 0


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cfg=configs(),
    work=arrivals,
    seed=st.integers(0, 2**32 - 1),
    finish_p=st.sampled_from([0.0, 0.05]),
    abort_p=st.sampled_from([0.0, 0.0, 0.02]),
)
def test_random_workloads_keep_every_invariant_and_finish(
    cfg: ts.SchedulerConfig, work: list[Arrival], seed: int, finish_p: float, abort_p: float
) -> None:
    check_outcome(run_workload(cfg, work, seed, finish_p, abort_p))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs(tiny=True), work=arrivals, seed=st.integers(0, 2**32 - 1))
def test_tiny_pools_force_eviction_and_retraction(
    cfg: ts.SchedulerConfig, work: list[Arrival], seed: int
) -> None:
    eng = run_workload(cfg, work, seed, 0.0, 0.0)
    check_outcome(eng)
    # Without early finishes or aborts, every accepted request generated all it could.
    for t in eng.requests.values():
        assert t.outputs == t.max_new or len(t.tokens) >= eng.max_model_len
