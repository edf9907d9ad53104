"""Scheduler step cost: microseconds per step (next_execution_plan + advance).

Not a test: it measures and writes JSON (benchmarks/results/scheduler_bench.json).

Scenarios:
  decode      N requests decoding with C-token contexts (unique prompts, no sharing): the
              steady-state cost the engine pays every step. Three variants per point:
              core (plan + one ForwardResult), arrays (also builds every numpy view the
              executor reads), per_request (advance with one ExtendResult per request).
  agentic     multi-turn sessions sharing a 2k-token system prompt, mixed batches on: each
              turn resends the conversation plus a new message, so prefixes hit.

Usage: python benchmarks/scheduler_bench.py [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

# OpenBLAS worker threads spin and steal one of the two cores from the measured loop.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import tokenspeed.scheduler as ts  # noqa: E402

PAGE_SIZE = 16


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def summarize(samples_ns: list[int]) -> dict[str, float]:
    us = [x / 1000 for x in samples_ns]
    return {
        "mean_us": statistics.fmean(us),
        "p50_us": percentile(us, 50),
        "p99_us": percentile(us, 99),
        "min_us": min(us),
    }


def run_plan(s: ts.Scheduler, plan: ts.ExecutionPlan, rng: np.random.Generator) -> None:
    """Answer a plan like an executor would (used outside the timed loops)."""
    events: list[object] = []
    for op in plan.cache_ops:
        done = ts.WriteBackDone if isinstance(op, ts.WriteBackOp) else ts.LoadBackDone
        events.append(done(op.op_id))
    if plan.forward is not None:
        n = int(plan.forward.sample_mask.sum())
        events.append(
            ts.ForwardResult(plan.forward.forward_id, rng.integers(0, 32000, n, dtype=np.int32))
        )
    s.advance(events)


def decode_point(batch: int, context: int, steps: int, variant: str) -> dict[str, object]:
    rng = np.random.default_rng(0)
    max_new = 2 * steps + 512  # the warm-up decodes too (steps alternate while prompts prefill)
    pages_per_request = -(-(context + max_new + 1) // PAGE_SIZE)
    cfg = ts.SchedulerConfig(
        page_size=PAGE_SIZE,
        num_device_pages=batch * pages_per_request + 64,
        max_scheduled_tokens=16384,
        max_batch_size=batch,
        max_model_len=context + max_new + 1,
    )
    s = ts.Scheduler(cfg)
    s.submit_requests(
        [
            ts.RequestSpec(f"req-{i:05d}", rng.integers(0, 32000, context, dtype=np.int32), max_new)
            for i in range(batch)
        ]
    )
    while s.stats().num_decoding < batch:  # prefill everything (not timed)
        run_plan(s, s.next_execution_plan(), rng)
    tokens = rng.integers(0, 32000, batch, dtype=np.int32)
    ids: list[str] | None = None
    samples: list[int] = []
    clock = time.perf_counter_ns
    for _ in range(steps):
        t0 = clock()
        op = s.next_execution_plan().forward
        if variant == "arrays":
            op.input_ids, op.seq_lens, op.prefix_lens, op.extend_lens  # noqa: B018
            op.request_pool_indices, op.sample_mask, op.block_tables  # noqa: B018
        if variant == "per_request":
            if ids is None:
                ids = op.request_ids
            s.advance(
                [
                    ts.ExtendResult(rid, [int(t)])
                    for rid, t in zip(ids, tokens.tolist(), strict=True)
                ]
            )
        else:
            s.advance(ts.ForwardResult(op.forward_id, tokens))
        samples.append(clock() - t0)
        assert op.mode == ts.ForwardMode.DECODE and len(op) == batch
    warm = samples[len(samples) // 10 :]  # drop the first 10%
    return {
        "batch": batch,
        "context": context,
        "variant": variant,
        "steps": len(warm),
        **summarize(warm),
    }


def agentic_point(sessions: int, turns: int, system_len: int, seed: int = 0) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    system = rng.integers(0, 32000, system_len, dtype=np.int32).tolist()
    cfg = ts.SchedulerConfig(
        page_size=PAGE_SIZE,
        num_device_pages=6000,
        num_host_pages=12000,
        max_scheduled_tokens=8192,
        max_batch_size=256,
        max_model_len=16384,
        enable_mixed_batch=True,
        enable_kv_events=True,
    )
    s = ts.Scheduler(cfg)
    history = {i: list(system) for i in range(sessions)}
    turn = dict.fromkeys(range(sessions), 0)
    outputs: dict[str, list[int]] = {}
    owner: dict[str, int] = {}

    def start_turn(i: int) -> None:
        msg = rng.integers(0, 32000, int(rng.integers(100, 400)), dtype=np.int32).tolist()
        history[i] = history[i] + msg
        rid = f"s{i}-t{turn[i]}"
        owner[rid] = i
        outputs[rid] = []
        s.submit_requests([ts.RequestSpec(rid, history[i], int(rng.integers(32, 160)))])

    for i in range(sessions):
        start_turn(i)
    samples: list[int] = []
    modes: dict[str, int] = {}
    clock = time.perf_counter_ns
    kv_events = 0
    while s.has_unfinished():
        t0 = clock()
        plan = s.next_execution_plan()
        events: list[object] = []
        for op in plan.cache_ops:
            done = ts.WriteBackDone if isinstance(op, ts.WriteBackOp) else ts.LoadBackDone
            events.append(done(op.op_id))
        op = plan.forward
        finished: list[str] = []
        if op is not None:
            modes[op.mode.name] = modes.get(op.mode.name, 0) + 1
            mask = op.sample_mask
            sampled_ids = [rid for rid, m in zip(op.request_ids, mask.tolist(), strict=True) if m]
            toks = rng.integers(0, 32000, len(sampled_ids), dtype=np.int32)
            events.append(ts.ForwardResult(op.forward_id, toks))
            for rid, t in zip(sampled_ids, toks.tolist(), strict=True):
                outputs[rid].append(t)
                if rng.random() < 0.01:  # a stop token
                    events.append(ts.Finish(rid, "stop"))
                    finished.append(rid)
        s.advance(events)
        kv_events += len(s.drain_kv_events())
        samples.append(clock() - t0)
        for rid in list(outputs):
            if rid in finished or (rid not in finished and s.request_stats(rid).finished):
                i = owner.pop(rid)
                history[i] = history[i] + outputs.pop(rid)
                turn[i] += 1
                if turn[i] < turns:
                    start_turn(i)
    st = s.stats()
    return {
        "sessions": sessions,
        "turns": turns,
        "system_prompt_tokens": system_len,
        "steps": len(samples),
        "modes": modes,
        "prefix_hit_rate": st.prefix_cache_hit_tokens / max(1, st.prefix_cache_queried_tokens),
        "preemptions": st.num_preemptions,
        "kv_events": kv_events,
        **summarize(samples),
        "note": "per step includes the Python driver's own bookkeeping (request_stats, id lists)",
    }


def best_of(repeats: int, fn, *args) -> dict[str, object]:
    """The run with the lowest median: other processes on a 2-core machine only add time."""
    runs = [fn(*args) for _ in range(repeats)]
    best = dict(min(runs, key=lambda r: r["p50_us"]))
    best["p50_us_of_runs"] = [r["p50_us"] for r in runs]
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer steps (smoke run)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per decode point (best kept)")
    parser.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "scheduler_bench.json")
    )
    args = parser.parse_args()
    steps = {64: 2000, 256: 1500, 1024: 600}
    if args.quick:
        steps = dict.fromkeys(steps, 100)

    results: dict[str, object] = {
        "method": "us per step = next_execution_plan() + advance(); decode points: best of "
        f"{args.repeats} runs by median, first 10% of steps dropped",
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "python": sys.version.split()[0],
        },
        "page_size": PAGE_SIZE,
        "decode": [],
        "context_scaling": [],
        "agentic": [],
    }
    print(f"{'scenario':<34}{'mean us':>10}{'p50 us':>10}{'p99 us':>10}")
    for batch in (64, 256, 1024):
        for variant in ("core", "arrays", "per_request"):
            r = best_of(args.repeats, decode_point, batch, 4096, steps[batch], variant)
            results["decode"].append(r)
            print(
                f"decode B={batch:<5} ctx=4096 {variant:<12}{r['mean_us']:>10.1f}{r['p50_us']:>10.1f}{r['p99_us']:>10.1f}"
            )
    for context in (1024, 16384):
        r = best_of(args.repeats, decode_point, 256, context, steps[256], "core")
        results["context_scaling"].append(r)
        print(
            f"decode B=256   ctx={context:<5} core        {r['mean_us']:>10.1f}{r['p50_us']:>10.1f}{r['p99_us']:>10.1f}"
        )
    sessions, turns = (16, 2) if args.quick else (64, 4)
    r = agentic_point(sessions, turns, 2048)
    results["agentic"].append(r)
    print(
        f"agentic {sessions}x{turns} turns, 2k system     {r['mean_us']:>10.1f}{r['p50_us']:>10.1f}{r['p99_us']:>10.1f}"
        f"   hit rate {r['prefix_hit_rate']:.2f}, {r['steps']} steps {r['modes']}"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
