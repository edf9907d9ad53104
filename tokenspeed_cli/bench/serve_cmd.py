"""`tokenspeed bench serve`: benchmark a running OpenAI-compatible server.

Flags follow `vllm bench serve` (random dataset, load shaping, goodput) and SGLang's
`bench_serving` (generated shared prefix); multi-turn is TokenSpeed's agentic pattern.
"""

from __future__ import annotations

import asyncio
import enum
import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from tokenizers import Tokenizer

from tokenspeed_cli.bench import datasets as ds
from tokenspeed_cli.bench.client import normalise_base_url
from tokenspeed_cli.bench.errors import BenchError
from tokenspeed_cli.bench.metrics import compute_metrics, parse_goodput, per_request_arrays
from tokenspeed_cli.bench.report import print_table, serving_table
from tokenspeed_cli.bench.report import save_result as write_result
from tokenspeed_cli.bench.runner import (
    LoadShape,
    ServeTarget,
    Workload,
    num_requests,
    prepare,
    run_workload,
)
from tokenspeed_cli.bench.tokens import TokenSampler, load_tokenizer
from tokenspeed_cli.console import console, fail


class DatasetName(enum.StrEnum):
    """The workloads `bench serve` can generate or load."""

    random = "random"
    generated_shared_prefix = "generated-shared-prefix"
    multi_turn = "multi-turn"
    sharegpt = "sharegpt"


class EndpointName(enum.StrEnum):
    """Which OpenAI endpoint the requests go to."""

    chat = "chat"
    completions = "completions"


_DATA = "Dataset"
_RANDOM = "Random dataset"
_GSP = "Generated shared prefix dataset"
_MT = "Multi-turn dataset"
_LOAD = "Load"


def build_workload(
    dataset: DatasetName,
    tokenizer: Tokenizer,
    opts: dict[str, Any],
) -> Workload:
    """The requests (or sessions) that ``dataset`` and its options describe."""
    n = opts["num_prompts"]
    seed = opts["seed"]
    if dataset is DatasetName.sharegpt:
        if opts["dataset_path"] is None:
            raise BenchError("--dataset sharegpt needs --dataset-path FILE.json")
        return ds.sharegpt_requests(tokenizer, opts["dataset_path"], n or 100,
                                    opts["sharegpt_output_len"], seed)  # fmt: skip
    sampler = TokenSampler(tokenizer)
    if dataset is DatasetName.random:
        return ds.random_requests(sampler, n or 100, opts["random_input_len"],
                                  opts["random_output_len"], opts["random_range_ratio"],
                                  opts["random_prefix_len"], seed)  # fmt: skip
    if dataset is DatasetName.generated_shared_prefix:
        return ds.shared_prefix_requests(sampler, opts["gsp_num_groups"],
                                         opts["gsp_prompts_per_group"],
                                         opts["gsp_system_prompt_len"], opts["gsp_question_len"],
                                         opts["gsp_output_len"], seed)  # fmt: skip
    return ds.multi_turn_sessions(sampler, opts["multi_turn_sessions"], opts["multi_turn_turns"],
                                  opts["multi_turn_system_prompt_len"],
                                  opts["multi_turn_tool_output_len"],
                                  opts["multi_turn_output_len"],
                                  not opts["multi_turn_distinct_system_prompts"],
                                  seed)  # fmt: skip


def warmup_requests(
    workload: Workload, tokenizer: Tokenizer, k: int, seed: int
) -> list[ds.BenchRequest]:
    """``k`` fresh random prompts shaped like the first requests (so no cache is pre-warmed)."""
    if k <= 0 or not workload:
        return []
    sampler = TokenSampler(tokenizer)
    rng = np.random.default_rng(seed + 7919)
    out = []
    for i in range(k):
        item = workload[i % len(workload)]
        req = item.request_for_turn(0, tokenizer) if isinstance(item, ds.Session) else item
        text = sampler.text(req.prompt_len, rng)
        out.append(ds.BenchRequest(text, [{"role": "user", "content": text}], req.prompt_len,
                                   req.output_len))  # fmt: skip
    return out


def _parse_extra_body(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise BenchError(f"--extra-body is not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise BenchError("--extra-body must be a JSON object")
    return value


def _default_tokenizer(tokenizer: str | None, model: str | None) -> str | None:
    """--tokenizer, else --model when it is a local directory with a tokenizer, else None."""
    if tokenizer is not None:
        return tokenizer
    if model is not None and (Path(model).expanduser() / "tokenizer.json").is_file():
        return model
    return None


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]benchmark"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("[red]{task.fields[failed]} failed"),
        TimeElapsedColumn(),
        console=console,
    )


def bench_serve(
    base_url: str = typer.Option(..., "--base-url", metavar="URL",
                                 help="Server address, e.g. http://127.0.0.1:8000."),
    model: str | None = typer.Option(None, "--model", help="Model name (default: the first of /v1/models)."),
    endpoint: EndpointName | None = typer.Option(
        None, "--endpoint", help="chat or completions (default: chat for multi-turn, else completions)."),
    dataset: DatasetName | None = typer.Option(
        None, "--dataset", help="Workload (default: sharegpt with --dataset-path, else random).",
        rich_help_panel=_DATA),
    dataset_path: Path | None = typer.Option(None, "--dataset-path", metavar="FILE.json",
                                             help="ShareGPT-format JSON file.", rich_help_panel=_DATA),
    num_prompts: int | None = typer.Option(
        None, "--num-prompts", min=1,
        help="Requests for random/sharegpt (default 100); the other datasets size themselves.",
        rich_help_panel=_DATA),
    sharegpt_output_len: int | None = typer.Option(
        None, "--sharegpt-output-len", min=1, help="Override the reference answers' lengths.",
        rich_help_panel=_DATA),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", metavar="PATH",
        help="Directory with tokenizer.json (default: --model if a local dir, else the tiny model's).",
        rich_help_panel=_DATA),
    random_input_len: int = typer.Option(1024, "--random-input-len", min=0, rich_help_panel=_RANDOM,
                                         help="Prompt tokens after the shared prefix."),
    random_output_len: int = typer.Option(128, "--random-output-len", min=1, rich_help_panel=_RANDOM,
                                          help="Output tokens (max_tokens)."),
    random_range_ratio: float = typer.Option(0.0, "--random-range-ratio", min=0.0,
                                             rich_help_panel=_RANDOM,
                                             help="Lengths uniform in [L*(1-r), L*(1+r)]."),
    random_prefix_len: int = typer.Option(0, "--random-prefix-len", min=0, rich_help_panel=_RANDOM,
                                          help="Tokens of one prefix shared by every prompt."),
    gsp_num_groups: int = typer.Option(64, "--gsp-num-groups", min=1, rich_help_panel=_GSP,
                                       help="Groups, each with its own system prompt."),
    gsp_prompts_per_group: int = typer.Option(16, "--gsp-prompts-per-group", min=1,
                                              rich_help_panel=_GSP, help="Questions per group."),
    gsp_system_prompt_len: int = typer.Option(2048, "--gsp-system-prompt-len", min=1,
                                              rich_help_panel=_GSP, help="System prompt tokens."),
    gsp_question_len: int = typer.Option(128, "--gsp-question-len", min=1, rich_help_panel=_GSP,
                                         help="Question tokens."),
    gsp_output_len: int = typer.Option(256, "--gsp-output-len", min=1, rich_help_panel=_GSP,
                                       help="Output tokens."),
    multi_turn_sessions: int = typer.Option(8, "--multi-turn-sessions", min=1, rich_help_panel=_MT,
                                            help="Concurrent sessions."),
    multi_turn_turns: int = typer.Option(4, "--multi-turn-turns", min=1, rich_help_panel=_MT,
                                         help="Turns per session (sent one after another)."),
    multi_turn_system_prompt_len: int = typer.Option(
        1024, "--multi-turn-system-prompt-len", min=0, rich_help_panel=_MT,
        help="System prompt (tool docs) tokens, shared by all sessions."),
    multi_turn_tool_output_len: int = typer.Option(
        256, "--multi-turn-tool-output-len", min=1, rich_help_panel=_MT,
        help="Tokens of each turn's new user (tool output) message."),
    multi_turn_output_len: int = typer.Option(128, "--multi-turn-output-len", min=1,
                                              rich_help_panel=_MT, help="Output tokens per turn."),
    multi_turn_distinct_system_prompts: bool = typer.Option(
        False, "--multi-turn-distinct-system-prompts", rich_help_panel=_MT,
        help="Give every session its own system prompt."),
    request_rate: float = typer.Option(float("inf"), "--request-rate", rich_help_panel=_LOAD,
                                       help="Requests (sessions) per second, Poisson; inf = all at once."),
    burstiness: float = typer.Option(1.0, "--burstiness", rich_help_panel=_LOAD,
                                     help="Gamma shape of the arrival gaps (1 = Poisson)."),
    max_concurrency: int | None = typer.Option(None, "--max-concurrency", min=1,
                                               rich_help_panel=_LOAD, help="Most requests in flight."),
    warmup: int = typer.Option(1, "--warmup-requests", min=0, rich_help_panel=_LOAD,
                               help="Untimed requests first (fresh prompts, same shapes)."),
    goodput: list[str] | None = typer.Option(
        None, "--goodput", metavar="KEY:MS",
        help='SLOs for goodput, e.g. --goodput "ttft:200 tpot:50" (keys ttft, tpot, e2el).'),
    seed: int = typer.Option(0, "--seed", help="Seed for prompts and arrival times."),
    ignore_eos: bool = typer.Option(True, "--ignore-eos/--no-ignore-eos",
                                    help="Send ignore_eos so outputs have exactly max_tokens."),
    extra_body: str | None = typer.Option(None, "--extra-body", metavar="JSON",
                                          help="Extra fields for every request body."),
    timeout: float | None = typer.Option(None, "--timeout", metavar="S",
                                         help="Per-request read timeout (default: none)."),
    save_result: Path | None = typer.Option(None, "--save-result", metavar="FILE.json",
                                            help="Write metrics and per-request arrays."),
) -> None:  # fmt: skip
    """Benchmark a running OpenAI-compatible server (ours or another engine's)."""
    opts = dict(locals())
    try:
        _run(opts)
    except BenchError as e:
        fail(str(e), code=1)


def _run(opts: dict[str, Any]) -> None:
    if opts["request_rate"] <= 0 or opts["burstiness"] <= 0:
        raise BenchError("--request-rate and --burstiness must be positive")
    slos = parse_goodput(opts["goodput"])
    extra = _parse_extra_body(opts["extra_body"])
    base_url = normalise_base_url(opts["base_url"])
    dataset = opts["dataset"] or (
        DatasetName.sharegpt if opts["dataset_path"] is not None else DatasetName.random
    )
    endpoint = opts["endpoint"] or (
        EndpointName.chat if dataset is DatasetName.multi_turn else EndpointName.completions
    )
    tok_path = _default_tokenizer(opts["tokenizer"], opts["model"])
    tokenizer = load_tokenizer(tok_path)
    workload = build_workload(dataset, tokenizer, opts)
    warmups = warmup_requests(workload, tokenizer, opts["warmup"], opts["seed"])
    target = ServeTarget(base_url, endpoint.value, opts["model"], opts["ignore_eos"], extra,
                         opts["timeout"])  # fmt: skip
    shape = LoadShape(
        opts["request_rate"], opts["burstiness"], opts["max_concurrency"], opts["seed"]
    )
    total = num_requests(workload)
    with console.status(f"checking {base_url} and warming up..."):
        model = asyncio.run(prepare(target, tokenizer, warmups, opts["max_concurrency"]))
    with _progress() as progress:
        task = progress.add_task("benchmark", total=total, failed=0)
        failed = 0

        def on_done(result: Any) -> None:
            nonlocal failed
            failed += 0 if result.success else 1
            progress.update(task, advance=1, failed=failed)

        outcome = asyncio.run(run_workload(target, model, workload, tokenizer, shape, on_done))
    metrics = compute_metrics(outcome.results, outcome.duration_s, slos, outcome.peak_concurrency)
    rate = opts["request_rate"]
    result: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "backend": "openai-chat" if endpoint is EndpointName.chat else "openai",
        "base_url": base_url,
        "model_id": outcome.model,
        "tokenizer_id": tok_path or "tokenspeed-tiny",
        "dataset": dataset.value,
        "num_prompts": total,
        "request_rate": rate if math.isfinite(rate) else "inf",
        "burstiness": opts["burstiness"],
        "max_concurrency": opts["max_concurrency"],
        "goodput_slos_ms": slos or None,
        "seed": opts["seed"],
        **metrics,
    }
    print_table(console, serving_table(result))
    if opts["save_result"] is not None:
        write_result(opts["save_result"], {**result, **per_request_arrays(outcome.results)})
        console.print(f"saved {opts['save_result']}", highlight=False)
    if metrics["completed"] == 0:
        first = next((r.error for r in outcome.results if r.error), "unknown error")
        raise BenchError(f"all {total} requests failed; first error: {first}")
