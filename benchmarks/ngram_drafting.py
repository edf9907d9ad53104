"""N-gram drafting cost: microseconds per decode step of the NGRAM drafter's host work.

Not a test: it measures and writes JSON (benchmarks/results/ngram_drafting.json).

R requests with histories of L tokens each, made the way agentic traffic looks to a prompt
lookup: random tokens (vocabulary 32k) with every fourth 64-token span copied from earlier in
the same history, so most suffixes have occurred before and drafts are found. Each step:
``propose`` (3 drafts per request, as ``--speculative-num-draft-tokens 4``) then ``observe``
(each request gains 1 to 3 tokens, as a verified block, quoting on from a place earlier
in its history as a model copying a file would, so its suffix keeps matching). Also the one-time ``install`` of a
history (admission). Medians over the steps, best of ``--repeats`` runs.

Usage: python benchmarks/ngram_drafting.py [--requests 64,256,1024] [--lengths 2048,16384]
       [--steps 50] [--repeats 3] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from tokenspeed.runtime.drafting import StepRecord  # noqa: E402
from tokenspeed.runtime.ngram_drafter import NgramDrafter  # noqa: E402

VOCAB = 32000
DRAFTS = 3
clock = time.perf_counter_ns


def agentic_history(rng: np.random.Generator, length: int) -> np.ndarray:
    """Random tokens where every fourth 64-token span repeats an earlier span."""
    out = rng.integers(1, VOCAB, size=length, dtype=np.int64)
    for start in range(256, length - 64, 256):
        src = int(rng.integers(0, start - 64))
        out[start : start + 64] = out[src : src + 64]
    return out


def draft_count(proposed: object) -> int:
    """Drafts proposed in one step, whichever form ``propose`` returns them in."""
    if isinstance(proposed, list):
        return sum(len(p) for p in proposed)
    return int(np.asarray(proposed.lens).sum())  # type: ignore[attr-defined]


def run_once(requests: int, length: int, steps: int, seed: int) -> dict[str, float]:
    """One drafter, ``requests`` histories of ``length`` tokens, ``steps`` decode steps."""
    rng = np.random.default_rng(seed)
    drafter = NgramDrafter(requests)
    histories = [agentic_history(rng, length) for _ in range(requests)]
    t0 = clock()
    for slot, hist in enumerate(histories):
        drafter.install(slot, hist.tolist())
    install_us = (clock() - t0) / 1e3 / requests
    slots = np.arange(requests, dtype=np.int64)
    positions = np.full(requests, length - 1, dtype=np.int64)
    tables = np.zeros((requests, 1), dtype=np.int32)
    quote = rng.integers(0, length // 2, size=requests)  # where each request copies from
    copied = np.stack(histories)
    propose_us, observe_us, found = [], [], 0
    for _ in range(steps):
        t0 = clock()
        proposed = drafter.propose(slots, positions, tables, DRAFTS)
        t1 = clock()
        found += draft_count(proposed)
        gained = rng.integers(1, DRAFTS + 1, size=requests).astype(np.int64)
        owner = np.repeat(np.arange(requests), gained)
        within = np.arange(len(owner)) - np.repeat(np.cumsum(gained) - gained, gained)
        tokens = copied[owner, quote[owner] + within]
        quote = quote + gained
        step = StepRecord(slots, positions, gained, np.zeros(requests, np.int64), gained,
                          tokens, tables, None, True)  # fmt: skip
        t2 = clock()
        drafter.observe(step)
        t3 = clock()
        positions = positions + gained
        propose_us.append((t1 - t0) / 1e3)
        observe_us.append((t3 - t2) / 1e3)
    return {
        "propose_us": float(np.median(propose_us)),
        "observe_us": float(np.median(observe_us)),
        "install_us_per_request": install_us,
        "drafts_per_request_step": found / (steps * requests),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", default="64,256,1024")
    ap.add_argument("--lengths", default="2048,16384")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/ngram_drafting.json")
    args = ap.parse_args()
    rows = []
    for length in map(int, args.lengths.split(",")):
        for requests in map(int, args.requests.split(",")):
            runs = [run_once(requests, length, args.steps, seed) for seed in range(args.repeats)]
            best = min(runs, key=lambda r: r["propose_us"] + r["observe_us"])
            row = {"requests": requests, "history": length, **best}
            rows.append(row)
            print(f"R={requests:5d} L={length:6d}  propose {best['propose_us']:9.1f} us  "
                  f"observe {best['observe_us']:8.1f} us  install "
                  f"{best['install_us_per_request']:8.1f} us/request  drafts/request "
                  f"{best['drafts_per_request_step']:.2f}", flush=True)  # fmt: skip
    meta = {"python": sys.version.split()[0], "numpy": np.__version__,
            "machine": platform.machine(), "cpus": os.cpu_count()}  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
