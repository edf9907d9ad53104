"""Offline throughput: TokenSpeed's engine against transformers' ``generate``, same requests.

Both sides get the same N requests of different prompt lengths and generate exactly
``--output-len`` tokens each (EOS ignored). transformers runs them as left-padded batches of
``--hf-batch-size``; TokenSpeed runs them through the scheduler with continuous batching on
paged KV. Prints a table and writes JSON. A measurement, never a test.

    python benchmarks/offline_throughput.py                         # tiny embedded model, CPU
    python benchmarks/offline_throughput.py --model qwen3-8b --load-format dummy --dtype bfloat16
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


def make_requests(n: int, vocab: int, min_len: int, max_len: int, seed: int) -> list[list[int]]:
    """``n`` random prompts with lengths spread uniformly over ``[min_len, max_len]``."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, max_len + 1, size=n)
    return [rng.integers(10, vocab - 10, size=int(k)).tolist() for k in lengths]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_tokenspeed(
    args: argparse.Namespace, prompts: list[list[int]]
) -> tuple[dict[str, Any], Any]:
    from tokenspeed.runtime import LLM, SamplingParams

    kwargs: dict[str, Any] = dict(
        dtype=args.dtype,
        load_format=args.load_format,
        device=args.device,
        max_num_seqs=args.max_num_seqs,
        chunked_prefill_size=args.chunked_prefill_size,
    )
    if args.max_model_len:
        kwargs["max_model_len"] = args.max_model_len
    if args.gpu_memory_utilization:
        kwargs["gpu_memory_utilization"] = args.gpu_memory_utilization
    started = time.perf_counter()
    llm = LLM(args.model, **kwargs)
    load_s = time.perf_counter() - started
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(
        prompts[: min(4, len(prompts))],
        SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
    )
    sync(llm.engine.executor.device.type)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    sync(llm.engine.executor.device.type)
    elapsed = time.perf_counter() - t0
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    return {
        "load_s": round(load_s, 2),
        "elapsed_s": round(elapsed, 3),
        "output_tokens": n_out,
        "output_tok_s": n_out / elapsed,
        "steps": llm.engine.num_steps,
        "device": str(llm.engine.executor.device),
        "dtype": str(llm.engine.executor.dtype).replace("torch.", ""),
        "kv_pages": llm.engine.executor.num_device_pages,
    }, llm


def run_transformers(
    args: argparse.Namespace,
    prompts: list[list[int]],
    device: torch.device,
    dtype: torch.dtype,
    path: Path,
    overrides: dict[str, Any],
) -> dict[str, Any]:
    """The same requests through ``generate`` in left-padded batches of ``--hf-batch-size``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if args.load_format == "dummy":
        config = AutoConfig.from_pretrained(path)
        config.update(overrides)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    model.eval()
    pad = 0
    n_out = 0
    bs = args.hf_batch_size

    def batch_generate(batch: list[list[int]]) -> int:
        width = max(map(len, batch))
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, p in enumerate(batch):  # left padding, as decoder-only generate needs
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        with torch.no_grad():
            out = model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=args.output_len,
                min_new_tokens=args.output_len,
                do_sample=False,
                pad_token_id=pad,
            )
        return (out.shape[1] - width) * len(batch)

    batch_generate(prompts[: min(4, len(prompts))])
    sync(device.type)
    t0 = time.perf_counter()
    for start in range(0, len(prompts), bs):
        n_out += batch_generate(prompts[start : start + bs])
    sync(device.type)
    elapsed = time.perf_counter() - t0
    return {
        "elapsed_s": round(elapsed, 3),
        "output_tokens": n_out,
        "output_tok_s": n_out / elapsed,
        "batch_size": bs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--model", default=None, help="model dir or shipped architecture name (default: tiny)"
    )
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--min-input-len", type=int, default=32)
    ap.add_argument("--max-input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--chunked-prefill-size", type=int, default=8192)
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--hf-batch-size", type=int, default=64)
    ap.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help="KV sizing on CUDA; transformers runs after the engine is freed",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch.set_num_threads for both engines (default: torch's, one per core)",
    )
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("offline_throughput.json"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)  # one setting, read by both engines in this process

    from tokenspeed.runtime.model_loader import load_hf_config
    from tokenspeed.runtime.model_source import resolve_model_path

    vocab = load_hf_config(resolve_model_path(args.model, args.load_format)).vocab_size
    prompts = make_requests(
        args.num_requests, vocab, args.min_input_len, args.max_input_len, args.seed
    )
    ours, llm = run_tokenspeed(args, prompts)
    result: dict[str, Any] = {
        "model": args.model or "tiny",
        "num_requests": len(prompts),
        "input_tokens": sum(map(len, prompts)),
        "output_len": args.output_len,
        "torch_threads": torch.get_num_threads(),
        "tokenspeed": ours,
    }
    if not args.skip_transformers:
        ex = llm.engine.executor
        device, dtype, path, overrides = (
            ex.device,
            ex.dtype,
            llm.model_path,
            dict(llm.args.hf_overrides),
        )
        del llm, ex  # free the engine's weights and KV pool before transformers loads its copy
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        result["transformers"] = run_transformers(args, prompts, device, dtype, path, overrides)
        result["speedup"] = ours["output_tok_s"] / result["transformers"]["output_tok_s"]
    print(f"{'engine':<14}{'output tok/s':>14}{'elapsed s':>12}")
    print(f"{'tokenspeed':<14}{ours['output_tok_s']:>14.1f}{ours['elapsed_s']:>12.2f}")
    if "transformers" in result:
        hf = result["transformers"]
        print(f"{'transformers':<14}{hf['output_tok_s']:>14.1f}{hf['elapsed_s']:>12.2f}")
        print(f"speedup: {result['speedup']:.2f}x")
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
