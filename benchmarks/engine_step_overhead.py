"""Engine step overhead: microseconds per step of the real EventLoop + C++ scheduler.

Not a test: it measures and writes JSON (benchmarks/results/engine_step_overhead.json).

N requests decode through the real ``EventLoop`` and ``Scheduler``; the model executor is a
stub that returns a fixed (non-stop) token for every sampled request with no model compute,
so what is left is the engine's own per-step cost. With ``--spec-tokens K`` (K > 1) every
decode step is a verified speculative step: the stub reports 1 to K accepted tokens per
request (a fixed pattern, mean (K + 1) / 2) and K - 1 drafts, as the MTP / n-gram verify
does. Each step is split into:

  scheduler   time inside next_execution_plan() + advance() (the C++ scheduler)
  executor    the stub's own host work (sample rows, request ids, the token array)
  engine      everything else: EventLoop.step() in Python (slot binding, stop checks,
              ForwardResult/Finish events, the step's token columns and updates)
  wire        (separate, not in the step) what the engine process does with the step's
              updates before the next: EngineCore.outputs (the message body, the live
              counters) and its msgpack encoding

Usage: python benchmarks/engine_step_overhead.py [--quick] [--batches 64,256,1024]
       [--spec-tokens K] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# OpenBLAS worker threads spin and steal one of the two cores from the measured loop.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import tokenspeed.scheduler as ts  # noqa: E402
from tokenspeed.runtime.engine.event_loop import EventLoop  # noqa: E402
from tokenspeed.runtime.entrypoints import ipc  # noqa: E402
from tokenspeed.runtime.entrypoints.engine_core import EngineCore, LiveCounters  # noqa: E402
from tokenspeed.runtime.model_executor import StepOutput  # noqa: E402
from tokenspeed.runtime.sampling import SamplingParams  # noqa: E402

PAGE_SIZE = 16
PROMPT_LEN = 64
VOCAB = 32000
TOKEN = 7  # never a stop token here (EOS is 0)
clock = time.perf_counter_ns


class StubExecutor:
    """The executor's host-side contract with no model: one fixed token per sampled row, or
    with ``spec_tokens`` > 1 a verified block of 1 to ``spec_tokens`` tokens per decode row."""

    def __init__(self, max_model_len: int, spec_tokens: int = 1) -> None:
        self.max_model_len = max_model_len
        self.hf_config = SimpleNamespace(vocab_size=VOCAB, eos_token_ids=lambda: [0])
        self.spec_tokens = spec_tokens
        self.steps = 0
        self.ns = 0

    def install_request(self, *args: Any) -> None:
        pass

    def execute(self, op: Any) -> StepOutput:
        t0 = clock()
        rows = np.flatnonzero(op.sample_mask)
        k = self.spec_tokens
        if k == 1:
            out = StepOutput(rows, np.full(len(rows), TOKEN, np.int64))
        else:  # decode rows accept 1..k tokens in turn; a prefill's last chunk samples one
            decode = np.asarray(op.prefix_lens)[rows] >= PROMPT_LEN
            counts = np.where(decode, (rows + self.steps) % k + 1, 1)
            drafted = np.where(decode, k - 1, 0)
            tokens = np.full(int(counts.sum()), TOKEN, np.int64)
            out = StepOutput(rows, tokens, counts=counts, drafted=drafted)
        self.steps += 1
        self.ns += clock() - t0
        return out

    def write_back(self, *args: Any) -> None:
        raise AssertionError("no host tier in this benchmark")

    load_back = write_back


class TimedScheduler:
    """Forwards to the real scheduler, adding up the time spent inside plan and advance."""

    def __init__(self, sched: ts.Scheduler) -> None:
        self._s = sched
        self.ns = 0

    def next_execution_plan(self) -> Any:
        t0 = clock()
        plan = self._s.next_execution_plan()
        self.ns += clock() - t0
        return plan

    def advance(self, events: Any) -> None:
        t0 = clock()
        self._s.advance(events)
        self.ns += clock() - t0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._s, name)


def summarize(xs_ns: list[int]) -> dict[str, float]:
    us = np.asarray(xs_ns, dtype=np.float64) / 1e3
    return {
        "p50_us": float(np.median(us)),
        "mean_us": float(us.mean()),
        "p99_us": float(np.percentile(us, 99)),
    }


def decode_point(batch: int, steps: int, spec_tokens: int = 1) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    warm_steps = 64  # prefill (about batch * PROMPT_LEN / 8192 steps) and a few decodes
    max_len = PROMPT_LEN + (warm_steps + steps) * spec_tokens + 64
    ex = StubExecutor(max_len, spec_tokens)
    cfg = ts.SchedulerConfig(
        page_size=PAGE_SIZE,
        num_device_pages=batch * (-(-max_len // PAGE_SIZE)) + 64,
        max_scheduled_tokens=8192 * spec_tokens,
        max_batch_size=batch,
        max_model_len=max_len,
        decode_input_tokens=spec_tokens,
    )
    sched = TimedScheduler(ts.Scheduler(cfg))
    loop = EventLoop(ex, sched, eos_token_ids=[0])  # type: ignore[arg-type]
    params = SamplingParams(temperature=0.0, max_tokens=max_len)
    for i in range(batch):
        loop.add_request(f"req-{i:05d}", rng.integers(1, VOCAB, PROMPT_LEN).tolist(), params)
    for _ in range(warm_steps):
        loop.step()
    assert sched.stats().num_decoding == batch
    core = EngineCore.__new__(EngineCore)  # only outputs(): no model, no sockets
    core._top_k = {}
    core.live = LiveCounters()
    core.loop = loop
    total, sched_t, exec_t, wire_t = [], [], [], []
    for _ in range(steps):
        sched.ns = ex.ns = 0
        t0 = clock()
        step = loop.step()
        total.append(clock() - t0)
        sched_t.append(sched.ns)
        exec_t.append(ex.ns)
        t0 = clock()
        out = core.outputs(step)
        ipc.pack({"type": ipc.OUTPUTS, **out})
        wire_t.append(clock() - t0)
        assert len(out["rids"]) + len(out.get("block_rids", ())) + len(out["items"]) == batch
    engine_t = [t - s - e for t, s, e in zip(total, sched_t, exec_t, strict=True)]
    warm = len(total) // 10  # drop the first 10%
    return {
        "batch": batch,
        "spec_tokens": spec_tokens,
        "steps": steps - warm,
        "step": summarize(total[warm:]),
        "scheduler": summarize(sched_t[warm:]),
        "executor_stub": summarize(exec_t[warm:]),
        "engine": summarize(engine_t[warm:]),
        "wire": summarize(wire_t[warm:]),
        "engine_us_per_request": float(np.median(engine_t[warm:])) / 1e3 / batch,
    }


def best_of(repeats: int, batch: int, steps: int, spec_tokens: int) -> dict[str, Any]:
    """The run with the lowest median step: other processes on a small VM only add time."""
    runs = [decode_point(batch, steps, spec_tokens) for _ in range(repeats)]
    best = dict(min(runs, key=lambda r: r["step"]["p50_us"]))
    best["step_p50_us_of_runs"] = [r["step"]["p50_us"] for r in runs]
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps, one run per point")
    ap.add_argument("--batches", default="64,256,1024")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--spec-tokens", type=int, default=1,
                    help="tokens a decode step verifies (> 1: speculative steps)")  # fmt: skip
    ap.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parent / "results" / "engine_step_overhead.json",
    )
    args = ap.parse_args()
    steps, repeats = (60, 1) if args.quick else (args.steps, args.repeats)
    points = []
    print(f"{'batch':>6} {'step':>9} {'sched':>9} {'exec':>9} {'engine':>9} {'eng/req':>8} "
          f"{'wire':>9}  (p50 us)")  # fmt: skip
    for batch in [int(b) for b in args.batches.split(",")]:
        r = best_of(repeats, batch, steps, args.spec_tokens)
        points.append(r)
        print(
            f"{batch:>6} {r['step']['p50_us']:>9.1f} {r['scheduler']['p50_us']:>9.1f} "
            f"{r['executor_stub']['p50_us']:>9.1f} {r['engine']['p50_us']:>9.1f} "
            f"{r['engine_us_per_request']:>8.3f} {r['wire']['p50_us']:>9.1f}",
            flush=True,
        )
    out = {
        "benchmark": "engine_step_overhead",
        "machine": {
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
        },
        "page_size": PAGE_SIZE,
        "prompt_len": PROMPT_LEN,
        "spec_tokens": args.spec_tokens,
        "points": points,
        "date": time.strftime("%Y-%m-%d"),
        "statistic": "median step (first 10% dropped) of the best of --repeats runs",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
