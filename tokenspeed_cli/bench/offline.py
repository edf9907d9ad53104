"""`tokenspeed bench offline`: engine throughput in this process, without HTTP.

For kernel and scheduler work: the same engine loop the server runs, driven through the
offline `LLM` API with token-id prompts of exact lengths and ``ignore_eos`` outputs, so the
numbers move only when the engine does.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

import typer

from tokenspeed.runtime.config import ConfigError, ServerArgs, resolve_server_args
from tokenspeed_cli.bench.datasets import BenchRequest, random_requests
from tokenspeed_cli.bench.errors import BenchError
from tokenspeed_cli.bench.report import offline_table, print_table
from tokenspeed_cli.bench.report import save_result as write_result
from tokenspeed_cli.bench.tokens import TokenSampler, load_tokenizer
from tokenspeed_cli.console import console, fail
from tokenspeed_cli.server_flags import server_args_command

ENGINE_STATS = ("queue_ms", "prefill_ms", "ttft_ms", "total_ms", "decode_tps", "cache_hit_rate",
                "preempt_count", "acc_len", "acc_rate")  # fmt: skip


def engine_stat_means(stats: list[Any]) -> dict[str, float]:
    """Means of the engine's per-request stats (those every finished request reported)."""
    present = [s for s in stats if s is not None]
    if not present:
        return {}
    return {
        key: sum(float(getattr(s, key)) for s in present) / len(present)
        for key in ENGINE_STATS
        if all(hasattr(s, key) for s in present)
    }


def run_offline(
    args: ServerArgs,
    requests: list[BenchRequest],
    tokenizer: Any,
    warmups: list[BenchRequest],
) -> dict[str, Any]:
    """Load the engine, warm it up, generate every request in one call and time that call.

    Warm-up prompts are different text from the measured ones, so they warm the code paths
    without pre-filling the prefix cache for the measured requests.
    """
    from tokenspeed.runtime import LLM, SamplingParams

    llm = LLM(**args.to_dict())
    prompts = [tokenizer.encode(r.prompt, add_special_tokens=False).ids for r in requests]
    params = [
        SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True) for r in requests
    ]
    if warmups:
        warm = [tokenizer.encode(r.prompt, add_special_tokens=False).ids for r in warmups]
        llm.generate(warm, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    input_lens = [len(p) for p in prompts]
    output_lens = [len(o.outputs[0].token_ids) for o in outputs]
    total_in, total_out = sum(input_lens), sum(output_lens)
    return {
        "elapsed_s": elapsed,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(outputs) / elapsed,
        "output_throughput": total_out / elapsed,
        "total_token_throughput": (total_in + total_out) / elapsed,
        "engine_stats": engine_stat_means([o.metrics for o in outputs]),
        "input_lens": input_lens,
        "output_lens": output_lens,
        "request_stats": [o.metrics.as_dict() if o.metrics else None for o in outputs],
    }


@server_args_command
def bench_offline(
    recipe: str | None = typer.Option(None, "--recipe", "-r", metavar="NAME|FILE",
                                      help="Recipe whose options sit under the flags."),
    num_prompts: int = typer.Option(64, "--num-prompts", min=1, help="Requests."),
    input_len: int = typer.Option(256, "--input-len", min=1, help="Prompt tokens (after prefix)."),
    output_len: int = typer.Option(64, "--output-len", min=1, help="Output tokens (EOS ignored)."),
    range_ratio: float = typer.Option(0.0, "--range-ratio", min=0.0,
                                      help="Lengths uniform in [L*(1-r), L*(1+r)]."),
    prefix_len: int = typer.Option(0, "--prefix-len", min=0,
                                   help="Tokens of one prefix shared by every prompt."),
    warmup: int = typer.Option(1, "--warmup-requests", min=0,
                               help="Short untimed requests first."),
    save_result: Path | None = typer.Option(None, "--save-result", metavar="FILE.json",
                                            help="Write the result as JSON."),
    *,
    overrides: dict[str, Any],
) -> None:  # fmt: skip
    """Engine throughput in this process through the offline LLM API (no HTTP)."""
    try:
        args = resolve_server_args(recipe, overrides)
        unsupported = args.unsupported_options()
        if unsupported:
            raise BenchError("this build cannot honour: " + "; ".join(unsupported))
        model_dir = None
        if args.model is not None:
            from tokenspeed.runtime.model_source import resolve_model_path

            model_dir = resolve_model_path(args.model, args.load_format)
        tokenizer = load_tokenizer(args.tokenizer or model_dir)
        sampler = TokenSampler(tokenizer)
        requests = random_requests(sampler, num_prompts, input_len, output_len,
                                   range_ratio, prefix_len, args.seed)  # fmt: skip
        warmups = random_requests(sampler, warmup, input_len, 4, seed=args.seed + 7919)
        with console.status("running the engine in this process..."):
            measured = run_offline(args, requests, tokenizer, warmups)
    except (BenchError, ConfigError) as e:
        fail(str(e), code=1)
    result = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "model": args.model or "tokenspeed-tiny",
        "recipe": recipe,
        "num_prompts": num_prompts,
        "input_len": input_len,
        "output_len": output_len,
        "range_ratio": range_ratio,
        "prefix_len": prefix_len,
        "server_args": args.to_dict(),
        **measured,
    }
    print_table(console, offline_table(result))
    if save_result is not None:
        try:
            write_result(save_result, result)
        except BenchError as e:
            fail(str(e), code=1)
        console.print(f"saved {save_result}", highlight=False)
