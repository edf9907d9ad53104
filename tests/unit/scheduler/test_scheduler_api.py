"""Behaviour of the scheduler through its Python bindings."""

from __future__ import annotations

import random

import numpy as np
import pytest
from scheduler_harness import FakeEngine

import tokenspeed.scheduler as ts


def make(**kw) -> ts.Scheduler:
    args = dict(page_size=4, num_device_pages=32, max_scheduled_tokens=64, max_batch_size=8)
    args.update(kw)
    return ts.Scheduler(ts.SchedulerConfig(**args))


def sampled(op: ts.ForwardOp) -> int:
    return int(op.sample_mask.sum())


def report(s: ts.Scheduler, plan: ts.ExecutionPlan, token: int = 7) -> None:
    events: list[object] = []
    for op in plan.cache_ops:
        done = ts.WriteBackDone if isinstance(op, ts.WriteBackOp) else ts.LoadBackDone
        events.append(done(op.op_id))
    if plan.forward is not None:
        n = sampled(plan.forward)
        events.append(ts.ForwardResult(plan.forward.forward_id, np.full(n, token, np.int32)))
    s.advance(events)


# --- configuration and submission ------------------------------------------------------------


def test_config_is_keyword_constructible_and_resolved() -> None:
    cfg = ts.SchedulerConfig(page_size=16, num_device_pages=100)
    assert cfg.max_model_len is None and cfg.max_scheduled_tokens == 8192
    assert cfg.max_batch_size == 256 and cfg.decode_input_tokens == 1
    s = ts.Scheduler(cfg)
    assert s.config.max_model_len == 1600
    assert "page_size=16" in repr(s.config)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"page_size": 0}, "page_size"),
        ({"num_device_pages": 0}, "num_device_pages"),
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"decode_input_tokens": 0}, "decode_input_tokens"),
        ({"num_host_pages": 8, "enable_prefix_cache": False}, "enable_prefix_cache"),
    ],
)
def test_invalid_config_names_the_field(kw: dict, field: str) -> None:
    args = {"page_size": 4, "num_device_pages": 8, **kw}
    with pytest.raises(ValueError, match=field):
        ts.Scheduler(ts.SchedulerConfig(**args))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (ts.RequestSpec("a", [], 4), "empty"),
        (ts.RequestSpec("a", list(range(60)), 8), "exceeds max_model_len"),
        (ts.RequestSpec("a", [1, 2], 0), "max_new_tokens"),
        (ts.RequestSpec("a", [1, -2], 1), "non-negative"),
    ],
)
def test_impossible_requests_are_rejected_at_submit(spec: ts.RequestSpec, message: str) -> None:
    s = make(num_device_pages=16)  # max_model_len 64
    with pytest.raises(ValueError, match=message):
        s.submit_requests([spec])
    assert not s.has_unfinished()


def test_more_pages_than_the_device_has_is_rejected() -> None:
    s = make(num_device_pages=4, max_model_len=1000)
    with pytest.raises(ValueError, match="KV pages"):
        s.submit_requests([ts.RequestSpec("a", list(range(15)), 2)])


def test_duplicate_ids_reject_the_whole_batch() -> None:
    s = make()
    with pytest.raises(ValueError, match="duplicate"):
        s.submit_requests([ts.RequestSpec("a", [1], 1), ts.RequestSpec("a", [2], 1)])
    assert s.num_requests == 0
    s.submit_requests([ts.RequestSpec("a", [1], 1)])
    with pytest.raises(ValueError, match="duplicate"):
        s.submit_requests([ts.RequestSpec("a", [1], 1)])


def test_tokens_accept_lists_and_integer_arrays() -> None:
    s = make()
    s.submit_requests(
        [
            ts.RequestSpec("a", [1, 2, 3], 1),
            ts.RequestSpec("b", np.array([1, 2, 3], dtype=np.int64), 1),
            ts.RequestSpec("c", np.array([1, 2, 3], dtype=np.int32), 1),
        ]
    )
    op = s.next_execution_plan().forward
    assert op.input_ids.tolist() == [1, 2, 3] * 3
    with pytest.raises(ValueError, match="int32"):
        ts.RequestSpec("d", np.array([2**40]), 1)
    with pytest.raises(TypeError):
        ts.RequestSpec("d", np.array([1.5]), 1)


# --- plans -----------------------------------------------------------------------------------


def test_prefill_decode_and_finish_by_length() -> None:
    s = make()
    s.submit_requests([ts.RequestSpec("a", list(range(6)), 3)])
    op = s.next_execution_plan().forward
    assert op.mode == ts.ForwardMode.EXTEND
    assert op.request_ids == ["a"] and len(op) == 1
    assert op.prefix_lens.tolist() == [0] and op.extend_lens.tolist() == [6]
    assert op.seq_lens.tolist() == [6] and op.sample_mask.tolist() == [True]
    assert op.block_tables.tolist() == [[0, 1]]
    s.advance(ts.ExtendResult("a", [100]))
    op = s.next_execution_plan().forward
    assert op.mode == ts.ForwardMode.DECODE
    assert op.input_ids.tolist() == [100]
    assert (op.prefix_lens.tolist(), op.seq_lens.tolist()) == ([6], [7])
    s.advance(ts.ExtendResult("a", [101]))
    s.advance(ts.ForwardResult(s.next_execution_plan().forward.forward_id, [102]))
    assert not s.has_unfinished()
    st = s.request_stats("a")
    assert st.finished and st.finish_reason == "length" and st.output_tokens == 3
    assert st.to_dict()["prompt_tokens"] == 6
    assert s.next_execution_plan().forward is None
    with pytest.raises(KeyError):
        s.request_stats("a")


def test_arrays_are_read_only_views_and_block_tables_pad_with_minus_one() -> None:
    s = make()
    s.submit_requests([ts.RequestSpec("a", list(range(9)), 8), ts.RequestSpec("b", [1], 8)])
    report(s, s.next_execution_plan())
    op = s.next_execution_plan().forward
    assert op.mode == ts.ForwardMode.DECODE and op.block_table_is_view
    bt = op.block_tables
    assert bt.dtype == np.int32 and bt.shape == (2, 3)
    assert not bt.flags.writeable and not op.input_ids.flags.writeable
    rows = {rid: bt[i].tolist() for i, rid in enumerate(op.request_ids)}
    assert rows["b"][1:] == [-1, -1] and min(rows["a"]) >= 0
    assert op.request_pool_indices.dtype == np.int32
    with pytest.raises(ValueError):
        op.input_ids[0] = 5
    del s  # the views keep the scheduler's memory alive
    assert bt.tolist() == [rows[rid] for rid in op.request_ids]


def test_chunked_prefill_budget_and_no_decode_starvation() -> None:
    s = make(max_scheduled_tokens=8)
    s.submit_requests([ts.RequestSpec("short", [1, 2, 3], 30)])
    report(s, s.next_execution_plan())
    s.submit_requests([ts.RequestSpec("long", list(range(40)), 2)])
    modes = []
    for _ in range(12):
        plan = s.next_execution_plan()
        op = plan.forward
        modes.append(op.mode.name)
        if op.mode == ts.ForwardMode.EXTEND:
            assert op.extend_lens.sum() <= 8
            assert op.sample_mask.tolist() == [op.seq_lens[0] == 40]
        report(s, plan)
    assert "EXTEND" in modes and "DECODE" in modes
    assert all(not (a == b == "EXTEND") for a, b in zip(modes, modes[1:], strict=False))


def test_mixed_batches_put_decodes_first_and_share_the_budget() -> None:
    s = make(enable_mixed_batch=True, max_scheduled_tokens=6)
    s.submit_requests([ts.RequestSpec("a", [1, 2, 3], 5)])
    report(s, s.next_execution_plan())
    s.submit_requests([ts.RequestSpec("b", list(range(20)), 5)])
    op = s.next_execution_plan().forward
    assert op.mode == ts.ForwardMode.MIXED and op.num_decode == 1
    assert op.request_ids == ["a", "b"]
    assert op.extend_lens.tolist() == [1, 5]  # the decode took one token of the budget
    assert op.sample_mask.tolist() == [True, False]
    assert op.block_table_is_view


def test_priority_runs_first() -> None:
    s = make(max_batch_size=1)
    s.submit_requests([ts.RequestSpec("late", [1], 1, priority=5), ts.RequestSpec("vip", [2], 1)])
    assert s.next_execution_plan().forward.request_ids == ["vip"]


def test_prefix_sharing_reuses_pages_and_counts_hits() -> None:
    s = make()
    prompt = list(range(20))
    s.submit_requests([ts.RequestSpec("a", prompt, 5)])
    report(s, s.next_execution_plan())
    s.submit_requests([ts.RequestSpec("b", [*prompt[:16], 99, 98], 2)])
    report(s, s.next_execution_plan())  # a decodes (steps alternate)
    op = s.next_execution_plan().forward
    assert op.request_ids == ["b"]
    assert op.prefix_lens.tolist() == [16] and op.extend_lens.tolist() == [2]
    a_pages = s.page_owners()["request_rows"]["a"]
    assert op.block_tables[0, :4].tolist() == a_pages[:4]
    assert s.request_stats("b").cached_tokens == 16
    st = s.stats()
    assert (st.prefix_cache_queried_tokens, st.prefix_cache_hit_tokens) == (38, 16)


def test_identical_prompts_in_one_step_are_deduplicated_after_the_forward() -> None:
    s = make()
    s.submit_requests(
        [ts.RequestSpec("a", list(range(9)), 4), ts.RequestSpec("b", list(range(9)), 4)]
    )
    report(s, s.next_execution_plan())
    s.next_execution_plan()
    rows = s.page_owners()["request_rows"]
    assert rows["a"][:2] == rows["b"][:2]  # both now use one copy of the two full pages
    s.check_invariants()


def test_prefix_cache_disabled_never_hits() -> None:
    s = make(enable_prefix_cache=False, enable_kv_events=True)
    for rid in ("a", "b"):
        s.submit_requests([ts.RequestSpec(rid, list(range(12)), 1)])
        report(s, s.next_execution_plan())
    assert s.request_stats("b").cached_tokens == 0
    assert s.drain_kv_events() == []
    assert s.stats().device_pages_free == 32


def test_speculative_verify_reserves_positions_and_accepts_several_tokens() -> None:
    s = make(decode_input_tokens=3)
    s.submit_requests([ts.RequestSpec("a", [1, 2, 3], 10)])
    report(s, s.next_execution_plan())
    op = s.next_execution_plan().forward
    assert op.extend_lens.tolist() == [3] and op.seq_lens.tolist() == [6]
    assert op.input_ids.tolist() == [7]  # the runtime appends its drafts
    s.advance(ts.ForwardResult(op.forward_id, [5, 6, 7], counts=[3]))
    op = s.next_execution_plan().forward
    assert op.prefix_lens.tolist() == [6] and op.input_ids.tolist() == [7]
    with pytest.raises(ValueError, match="at most 3"):
        s.advance(ts.ExtendResult("a", [1, 2, 3, 4]))


# --- events --------------------------------------------------------------------------------


def test_event_protocol_edges() -> None:
    s = make()
    with pytest.raises(KeyError):
        s.advance(ts.ExtendResult("ghost", [1]))
    with pytest.raises(ts.UnknownRequestError):
        s.advance(ts.Finish("ghost", "stop"))
    s.advance(ts.Abort("ghost"))  # aborts are idempotent
    s.submit_requests([ts.RequestSpec("a", [1, 2, 3, 4, 5], 1)])
    with pytest.raises(ts.InvalidTransition, match="Waiting"):
        s.advance(ts.ExtendResult("a", [1]))
    report(s, s.next_execution_plan())  # one token: the scheduler finishes it
    s.advance([ts.Finish("a", "length"), ts.ExtendResult("a", [3]), ts.Abort("a")])
    assert s.request_stats("a").finish_reason == "length"
    with pytest.raises(ValueError, match="unknown or completed"):
        s.advance(ts.WriteBackDone(1234))
    with pytest.raises(TypeError):
        s.advance("not an event")


def test_empty_extend_result_is_accepted_for_an_unfinished_prefill() -> None:
    s = make(max_scheduled_tokens=4)
    s.submit_requests([ts.RequestSpec("a", list(range(10)), 2)])
    op = s.next_execution_plan().forward
    assert op.sample_mask.tolist() == [False]
    s.advance(ts.ExtendResult("a", []))
    s.advance(ts.ForwardResult(op.forward_id, []))
    assert s.next_execution_plan().forward.prefix_lens.tolist() == [4]


def test_forward_result_must_name_the_latest_forward() -> None:
    s = make()
    s.submit_requests([ts.RequestSpec("a", [1, 2], 4)])
    op = s.next_execution_plan().forward
    with pytest.raises(ValueError, match="latest"):
        s.advance(ts.ForwardResult(op.forward_id + 1, [1]))
    with pytest.raises(ValueError, match="expected 1"):
        s.advance(ts.ForwardResult(op.forward_id, [1, 2]))


def test_abort_in_every_state_frees_everything() -> None:
    s = make(num_device_pages=8, page_size=2, max_scheduled_tokens=4, num_host_pages=8)
    eng = FakeEngine(s, random.Random(0))
    for i in range(4):
        eng.submit(f"r{i}", [i] * 5, 6)
    seen: set[str] = set()
    for _ in range(40):
        if not s.has_unfinished():
            break
        for rid in eng.unfinished():
            seen.add(s.request_stats(rid).state)
        eng.step(abort_prob=0.1)
    eng.run_until_done(abort_prob=0.2)
    assert {"Waiting", "Prefilling", "Decoding"} <= seen
    st = s.stats()
    assert st.device_pages_active == 0 and st.device_pages_free + st.device_pages_cached == 8


# --- retraction ------------------------------------------------------------------------------


@pytest.mark.parametrize("host_pages", [0, 32])
def test_page_pressure_retracts_the_youngest_and_everything_finishes(host_pages: int) -> None:
    s = make(num_device_pages=10, page_size=2, num_host_pages=host_pages, enable_kv_events=True)
    eng = FakeEngine(s, random.Random(1))
    for i in range(4):
        eng.submit(f"r{i}", [i, i + 1, i + 2], 12)
    kinds: set[str] = set()
    while s.has_unfinished():
        plan = eng.step()
        kinds |= {type(op).__name__ for op in plan.cache_ops}
        assert eng.steps < 500
    assert s.stats().num_preemptions > 0
    assert all(t.outputs == 12 for t in eng.requests.values())
    if host_pages:
        assert kinds == {"WriteBackOp", "LoadBackOp"}
    else:
        assert not kinds


def test_preemption_is_tracked_per_request() -> None:
    s = make(num_device_pages=6, page_size=2)
    s.submit_requests([ts.RequestSpec("old", [1, 2, 3], 6), ts.RequestSpec("young", [4, 5, 6], 6)])
    stats: dict[str, ts.RequestStats] = {}
    while s.has_unfinished():
        plan = s.next_execution_plan()
        for rid in ("old", "young"):
            try:
                stats[rid] = s.request_stats(rid)
            except KeyError:
                pass
        report(s, plan)
    assert stats["young"].preempt_count >= 1 and stats["young"].preempt_ms >= 0.0
    assert stats["old"].preempt_count == 0


# --- KV events, snapshot, hashes -------------------------------------------------------------


def test_kv_events_wire_format_and_chained_hashes() -> None:
    s = make(enable_kv_events=True)
    s.submit_requests([ts.RequestSpec("a", list(range(10)), 1)])
    report(s, s.next_execution_plan())
    events = s.drain_kv_events()
    assert len(events) == 1 and isinstance(events[0], ts.BlockStored)
    ev = events[0]
    assert ev.to_wire() == (
        "BlockStored",
        ts.rolling_hash(list(range(8)), 4),
        None,
        list(range(8)),
        4,
        None,
        "GPU",
    )
    assert s.drain_kv_events() == []
    assert s.reset_prefix_cache()
    (cleared,) = s.drain_kv_events()
    assert cleared.to_wire() == ("AllBlocksCleared",)
    removed = ts.BlockRemoved([1, 2], medium="CPU")
    assert removed.to_wire() == ("BlockRemoved", [1, 2], "CPU")
    assert ts.BlockStored([5], 4, [1], 1, "CPU").to_wire()[2] == 4


def test_rolling_hash_chains() -> None:
    h = ts.rolling_hash([1, 2, 3, 4, 5], 2)
    assert len(h) == 2
    assert ts.rolling_hash([3, 4], 2, parent=h[0]) == [h[1]]
    assert ts.rolling_hash(np.array([1, 2, 3, 4], dtype=np.int32), 2) == h


def test_cache_snapshot_is_plain_data() -> None:
    s = make()
    s.submit_requests(
        [
            ts.RequestSpec("a", list(range(13)), 1),
            ts.RequestSpec("b", [*range(8), 50, 51, 52, 53, 54], 1),
        ]
    )
    report(s, s.next_execution_plan())
    s.next_execution_plan()
    snap = s.cache_snapshot(16)
    assert snap["page_size"] == 4 and snap["num_nodes"] == 4 and not snap["truncated"]
    root, shared, *leaves = snap["nodes"]
    assert root["parent_id"] is None and root["num_tokens"] == 0
    assert shared["token_ids"] == list(range(8)) and shared["parent_id"] == root["id"]
    assert sorted(n["token_ids"] for n in leaves) == [[8, 9, 10, 11], [50, 51, 52, 53]]
    assert all(n["parent_id"] == shared["id"] and n["prefix_len"] == 8 for n in leaves)
    assert all(n["lock_count"] == 0 and n["host_pages"] == [] for n in snap["nodes"])
    assert s.cache_snapshot(2)["truncated"]


def test_reset_prefix_cache_refuses_while_requests_run() -> None:
    s = make()
    s.submit_requests([ts.RequestSpec("a", list(range(9)), 4)])
    report(s, s.next_execution_plan())
    s.next_execution_plan()
    assert not s.reset_prefix_cache()
    s.advance(ts.Abort("a"))
    assert s.reset_prefix_cache()
    assert s.stats().device_pages_free == 32


def test_stats_to_dict() -> None:
    s = make(num_host_pages=4)
    d = s.stats().to_dict()
    assert d["device_pages_total"] == 32 and d["host_pages_total"] == 4
    assert d["host_pages_free"] == 4 and d["num_waiting"] == 0
    assert "SchedulerStats(" in repr(s.stats())


def test_schedulers_are_independent() -> None:
    a, b = make(), make()
    a.submit_requests([ts.RequestSpec("x", [1], 1)])
    b.submit_requests([ts.RequestSpec("x", [1], 1)])
    assert a.next_execution_plan().forward.block_tables.tolist() == [[0]]
    assert b.next_execution_plan().forward.block_tables.tolist() == [[0]]
