"""The EventLoop over the C++ scheduler: stop conditions, stats, seeds, aborts, rejections."""

from __future__ import annotations

import pytest
from runtime_helpers import NUM_NEW

from tokenspeed.runtime.engine.event_loop import EventLoop
from tokenspeed.runtime.model_executor import ExecutorConfig, ModelExecutor
from tokenspeed.runtime.sampling import SamplingParams
from tokenspeed.scheduler import Scheduler, SchedulerConfig


def make_loop(path, *, budget=8192, tokens=4096, page=4, eos=()) -> EventLoop:
    ex = ModelExecutor(
        ExecutorConfig(
            model_path=path, device="cpu", page_size=page, max_total_tokens=tokens, max_num_seqs=8
        )
    )
    cfg = SchedulerConfig(
        page_size=page,
        num_device_pages=ex.num_device_pages,
        max_scheduled_tokens=budget,
        max_batch_size=8,
        max_model_len=512,
        enable_prefix_cache=True,
    )
    return EventLoop(ex, Scheduler(cfg), eos_token_ids=eos)


def run(loop: EventLoop, prompts, params) -> dict[str, list[int]]:
    params = params if isinstance(params, list) else [params] * len(prompts)
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        loop.add_request(f"r{i}", p, sp)
    out: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    finished = {}
    for _ in range(10_000):
        if not loop.has_work():
            break
        for u in loop.step():
            out[u.request_id].extend(u.new_token_ids)
            if u.finished:
                finished[u.request_id] = u
    assert not loop.has_work()
    run.finished = finished
    return out


GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_NEW)


def test_stop_tokens_min_tokens_and_stats(checkpoints, prompts, references):
    ref = references["llama"][0]
    stop_tok = ref[0][5]
    loop = make_loop(checkpoints["llama"], eos=[stop_tok])
    params = [
        SamplingParams(temperature=0.0, max_tokens=NUM_NEW),  # stops at EOS (stop_tok)
        SamplingParams(temperature=0.0, max_tokens=NUM_NEW, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=7),
        SamplingParams(temperature=0.0, max_tokens=NUM_NEW, stop_token_ids=[ref[3][2]]),
    ]
    out = run(loop, prompts[:4], params)
    cut = ref[0].index(stop_tok) + 1
    assert out["r0"] == ref[0][:cut] and run.finished["r0"].finish_reason == "stop"
    assert out["r1"] == ref[1] and run.finished["r1"].finish_reason == "length"
    assert out["r2"] == ref[2][:7] and run.finished["r2"].finish_reason == "length"
    assert out["r3"] == ref[3][: ref[3].index(ref[3][2]) + 1]
    stats = run.finished["r1"].stats
    assert stats.prompt_tokens == len(prompts[1]) and stats.output_tokens == NUM_NEW
    assert 0 <= stats.queue_ms <= stats.ttft_ms <= stats.total_ms and stats.decode_tps > 0


def test_seeded_sampling_is_batch_independent(checkpoints, prompts):
    sp = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=12)
    alone = run(make_loop(checkpoints["qwen3"]), [prompts[2]], sp)["r0"]
    others = [SamplingParams(temperature=1.0, max_tokens=12) for _ in range(3)]
    crowd = run(
        make_loop(checkpoints["qwen3"]),
        [prompts[0], prompts[1], prompts[2], prompts[3]],
        [others[0], others[1], sp, others[2]],
    )
    assert crowd["r2"] == alone
    assert crowd["r2"] != crowd["r0"]


def test_abort_and_rejections(checkpoints, prompts):
    loop = make_loop(checkpoints["qwen3"])
    loop.add_request("a", prompts[0], GREEDY)
    loop.add_request("b", prompts[1], GREEDY)
    loop.step()
    loop.abort_request("a")
    got = {}
    while loop.has_work():
        for u in loop.step():
            if u.finished:
                got[u.request_id] = u.finish_reason
    assert got == {"a": "abort", "b": "length"}
    with pytest.raises(ValueError, match="maximum model length"):
        loop.add_request("c", [1] * 600, GREEDY)
    with pytest.raises(ValueError, match="token ids must be in"):
        loop.add_request("d", [10**6], GREEDY)
    with pytest.raises(ValueError, match="empty"):
        loop.add_request("e", [], GREEDY)


def test_min_tokens_defers_eos(checkpoints, prompts, references):
    ref = references["qwen3"][0][0]
    eos = ref[0]  # greedy would stop at once
    loop = make_loop(checkpoints["qwen3"], eos=[eos])
    out = run(
        loop,
        [prompts[0], prompts[0]],
        [GREEDY, SamplingParams(temperature=0.0, max_tokens=NUM_NEW, min_tokens=5)],
    )
    assert out["r0"] == [eos] and run.finished["r0"].finish_reason == "stop"
    assert len(out["r1"]) >= 5 and eos not in out["r1"][:5]


def test_a_step_sends_plain_decode_tokens_as_columns_and_the_rest_as_updates(
    checkpoints, prompts, references
):
    """Every sampled token reaches the caller once: a request's first token (with its cache
    hit) and its last (with the finish) as ``RequestUpdate``s, the tokens between as the
    step's ``rids``/``tokens`` columns; and the columns equal the tokens transformers gives."""
    loop = make_loop(checkpoints["llama"])
    limits = [NUM_NEW, 5, NUM_NEW, 9]
    for i, (p, n) in enumerate(zip(prompts[:4], limits, strict=True)):
        loop.add_request(f"r{i}", p, SamplingParams(temperature=0.0, max_tokens=n))
    got: dict[str, list[int]] = {f"r{i}": [] for i in range(4)}
    columns = 0
    while loop.has_work():
        step = loop.step()
        special = {u.request_id: u for u in step.updates}
        assert not special.keys() & set(step.rids)  # each request at most once per step
        for rid, token in zip(step.rids, step.tokens, strict=True):
            assert got[rid], "a first token travels as an update, with its cache hit"
            got[rid].append(token)
            columns += 1
        for rid, u in special.items():
            assert (u.cached_tokens is not None) == (not got[rid])  # first token
            assert u.finished == (len(got[rid]) + len(u.new_token_ids) == limits[int(rid[1])])
            got[rid].extend(u.new_token_ids)
        assert [u.request_id for u in step] == [*special, *step.rids]
    assert columns == sum(limits) - 2 * 4
    ref = references["llama"][0]
    assert [got[f"r{i}"] for i in range(4)] == [ref[i][:n] for i, n in enumerate(limits)]
