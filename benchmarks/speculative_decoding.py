"""Speculative decoding (NGRAM or MTP) against plain decoding: the same requests and tokens.

Both engines generate ``--output-len`` tokens (EOS ignored) for the same prompts, greedy;
the outputs are checked equal, then decode throughput, steps and the drafts' acceptance are
reported. How much NGRAM gains depends on how much the output repeats its context: the
embedded tiny model (random weights) repeats itself in short loops, a real model copying a
file or a tool result repeats long spans. MTP needs a checkpoint with an MTP layer; with
dummy weights its drafts are never right, so the run measures what drafting costs. A
measurement, never a test.

    python benchmarks/speculative_decoding.py                               # NGRAM, tiny, CPU
    python benchmarks/speculative_decoding.py --device cuda --model qwen3-8b --load-format dummy \
        --dtype bfloat16 --repeats 1 --out FILE.json
    python benchmarks/speculative_decoding.py --algorithm MTP --draft-tokens 2 --device cuda \
        --model deepseek-v3 --load-format dummy --dtype bfloat16 \
        --hf-overrides '{"num_hidden_layers": 8, "n_routed_experts": 64}' --out FILE.json
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch


def run(
    args: argparse.Namespace, prompts: list[list[int]], spec: bool, batch: int | None = None
) -> dict[str, Any]:
    from tokenspeed.runtime import LLM, SamplingParams

    extra: dict[str, Any] = {}
    if spec:
        extra = {"speculative_algorithm": args.algorithm,
                 "speculative_num_steps": args.draft_tokens - 1,
                 "speculative_num_draft_tokens": args.draft_tokens}  # fmt: skip
    if args.load_format:
        extra["load_format"] = args.load_format
    if args.dtype:
        extra["dtype"] = args.dtype
    if args.hf_overrides:
        extra["hf_overrides"] = json.loads(args.hf_overrides)
    llm = LLM(args.model, device=args.device, max_total_tokens=args.max_total_tokens,
              max_num_seqs=batch or args.batch, **extra)  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    # warm-up: the measured batch and lengths, twice, so every kernel shape the timed run
    # meets has compiled: the second pass finds the prompts in the prefix cache, as the timed
    # one does, and prefills with a cached prefix (other kernels). With one pass the process's
    # first engine timed at a quarter of the later ones' speed on an H100 (1 022 against 4 038
    # tok/s) and, with two repeats, halved the plain median.
    warmup_seconds = []
    for _ in range(2):
        t0 = time.perf_counter()
        llm.generate(prompts, params)
        warmup_seconds.append(round(time.perf_counter() - t0, 4))
    steps0 = llm.engine.num_steps
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    ex = llm.engine.executor
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    result = {
        "engine": args.algorithm.lower() if spec else "plain",
        "seconds": round(seconds, 4),
        "warmup_seconds": warmup_seconds,
        "output_tokens_per_s": round(tokens / seconds, 1),
        "steps": llm.engine.num_steps - steps0,
        "drafted": ex.spec_drafted,
        "accepted": ex.spec_accepted,
        "acceptance": round(ex.spec_accepted / ex.spec_drafted, 3) if ex.spec_drafted else None,
        "tokens": [o.outputs[0].token_ids for o in outs],
    }
    del llm, ex  # the next engine needs this one's device memory (its pool, graphs)
    gc.collect()
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
        result["gib_held_after"] = round(torch.cuda.memory_allocated() / 2**30, 2)
    return result


def parting_positions(xs: list[list[int]], ys: list[list[int]]) -> list[int]:
    """Sorted first positions where paired outputs differ (outputs that never differ left out)."""
    firsts = (next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), None)
              for x, y in zip(xs, ys, strict=True))  # fmt: skip
    return sorted(i for i in firsts if i is not None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory (default: the tiny model)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--load-format", default=None, help="dummy: random weights of --model")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--hf-overrides", default=None, help="JSON merged into the model config")
    ap.add_argument("--algorithm", default="NGRAM", choices=("NGRAM", "MTP"))
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--max-total-tokens", type=int, default=32768)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved runs of each engine")
    ap.add_argument("--control", action="store_true",
                    help="also run plain decoding at a quarter of the batch: how often other "
                    "kernel shapes alone part the outputs (rounding at near-ties)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, 1000, size=args.prompt_len).tolist()
               for _ in range(args.num_prompts)]  # fmt: skip
    runs: list[dict[str, Any]] = []
    for _ in range(args.repeats):
        for spec in (False, True):
            runs.append(run(args, prompts, spec))
    name = args.algorithm.lower()
    plain = [r for r in runs if r["engine"] == "plain"]
    spec_runs = [r for r in runs if r["engine"] == name]
    same = all(r["tokens"] == plain[0]["tokens"] for r in runs)
    # where outputs part (bf16 kernels of different shapes round differently; near-ties flip)
    diverged = parting_positions(spec_runs[0]["tokens"], plain[0]["tokens"])
    median = {engine: float(np.median([r["output_tokens_per_s"] for r in rs]))
              for engine, rs in (("plain", plain), (name, spec_runs))}  # fmt: skip
    summary = {
        "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(),
        "model": args.model or "tokenspeed-tiny",
        "algorithm": args.algorithm,
        "hf_overrides": args.hf_overrides,
        "num_prompts": args.num_prompts,
        "output_len": args.output_len,
        "draft_tokens": args.draft_tokens,
        "outputs_equal": same,
        "outputs_parted": len(diverged),  # of the first runs' outputs, how many differ
        "first_parting_position": diverged[0] if diverged else None,
        "median_tokens_per_s": median,
        "speedup": round(median[name] / median["plain"], 3),
        "steps": {"plain": plain[0]["steps"], name: spec_runs[0]["steps"]},
        "acceptance": spec_runs[0]["acceptance"],
        "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs],
    }
    if args.control:
        control = run(args, prompts, False, batch=max(1, args.batch // 4))
        parted = parting_positions(control["tokens"], plain[0]["tokens"])
        summary["control_plain_quarter_batch"] = {
            "outputs_parted": len(parted),
            "first_parting_position": parted[0] if parted else None,
        }
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=1))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
