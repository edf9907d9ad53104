"""``tokenspeed replay-kv-events``: subscribe to (or read a recording of) KV-cache events,
rebuild the block index, validate the stream, print statistics, simulate a KV-aware router.

Registered on the main app as ``app.command("replay-kv-events")(replay_kv_events)``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from tokenspeed_cli.console import console, err_console, fail
from tokenspeed_cli.kv_events.index import BlockIndex
from tokenspeed_cli.kv_events.recording import (
    RawMessage,
    RecordingError,
    RecordingWriter,
    read_recording,
)
from tokenspeed_cli.kv_events.server_api import ServerError, load_tokenizer, server_tokenizer
from tokenspeed_cli.kv_events.simulate import SimulationResult, TraceError, load_trace, simulate
from tokenspeed_cli.kv_events.subscriber import Subscriber, SubscriberError
from tokenspeed_cli.kv_events.wire import MalformedEvent, decode_batch

__all__ = ["replay_kv_events"]


def _rolling_hash() -> Any:
    from tokenspeed.scheduler import rolling_hash

    return rolling_hash


def _live_messages(
    sub: Subscriber, since: int | None, duration: float | None
) -> Iterator[RawMessage]:
    deadline = None if duration is None else time.monotonic() + duration
    try:
        yield from sub.messages(since=since, deadline=deadline)
    except KeyboardInterrupt:  # Ctrl-C ends a live session; the statistics still print
        return


def _consume(
    messages: Iterator[RawMessage],
    index: BlockIndex,
    writer: RecordingWriter | None,
    max_events: int | None,
) -> int:
    """Decode and apply messages (recording them if asked) until `max_events`; events seen."""
    seen = 0
    for msg in messages:
        if writer is not None:
            writer.write(msg)
        index.apply(decode_batch(msg.seq, msg.payload))
        seen = sum(index.stats.events.values())
        if max_events is not None and seen >= max_events:
            break
    return seen


def _tokenizer_loader(tokenizer: Path | None, url: str | None) -> Any:
    if tokenizer is not None:
        return lambda: load_tokenizer(tokenizer)
    if url is not None:
        return lambda: server_tokenizer(url)
    return None


def _simulate(
    trace: Path, index: BlockIndex, block_size: int | None, loader: Any
) -> SimulationResult:
    prompts = load_trace(trace, loader)
    size = block_size or index.block_size
    if size is None:
        raise TraceError(
            "the stream stored no blocks (or several block sizes); give --block-size for --trace"
        )
    return simulate(prompts, index, size)


# ---- rendering -------------------------------------------------------------------------------
def _render(source: str, summary: dict[str, Any], sim: SimulationResult | None) -> None:
    stream = Table(title=f"KV events from {source}", show_header=False, title_justify="left")
    stream.add_column(style="bold")
    stream.add_column()
    seqs = (
        "-" if summary["first_seq"] is None else f"{summary['first_seq']} .. {summary['last_seq']}"
    )
    stream.add_row("batches", f"{summary['batches']} (seq {seqs})")
    stream.add_row("time span", f"{summary['time_span_s']:.3f} s")
    for kind in ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
        stream.add_row(kind, str(summary["events"].get(kind, 0)))
    stream.add_row("block size", ", ".join(map(str, summary["block_sizes"])) or "-")
    gaps = summary["gaps"]
    gap_text = ", ".join(f"{a}..{b}" for a, b in gaps[:5]) + (" ..." if len(gaps) > 5 else "")
    stream.add_row("sequence gaps", f"{len(gaps)} ({summary['missing_batches']} batches)"
                   + (f": {gap_text}" if gaps else ""))  # fmt: skip
    if summary["started_mid_stream"]:
        stream.add_row("note", "joined mid-stream (no replay): earlier blocks are unknown")
    console.print(stream)

    blocks = Table(title="Blocks by medium", title_justify="left")
    for col in ("medium", "stored", "removed", "live"):
        blocks.add_column(col, justify="left" if col == "medium" else "right")
    media = sorted({*summary["blocks_stored"], *summary["blocks_removed"], *summary["blocks_live"]})
    for m in media:
        blocks.add_row(m, *(str(summary[k].get(m, 0)) for k in
                            ("blocks_stored", "blocks_removed", "blocks_live")))  # fmt: skip
    console.print(blocks)

    if summary["valid"]:
        console.print("[bold green]stream valid[/]: no gaps, no unknown removals, no missing "
                      "parents, no duplicate stores")  # fmt: skip
    else:
        issues = Table(title="Validation issues", title_justify="left")
        issues.add_column("issue", style="bold red")
        issues.add_column("count", justify="right")
        issues.add_column("first examples")
        for kind, count in summary["issues"].items():
            issues.add_row(kind, str(count), "\n".join(summary["issue_examples"].get(kind, [])))
        console.print(issues)

    if sim is not None:
        d = sim.to_dict()
        table = Table(title=f"Router simulation ({d['requests']} requests, "
                            f"{d['prompt_tokens']} prompt tokens)", title_justify="left")  # fmt: skip
        for col in ("index", "matched tokens", "hit rate"):
            table.add_column(col, justify="left" if col == "index" else "right")
        table.add_row("as rebuilt (GPU)", str(d["hit_tokens"]), f"{d['hit_rate']:.1%}")
        table.add_row("any tier", str(d["hit_tokens_any_tier"]), f"{d['hit_rate_any_tier']:.1%}")
        table.add_row("learning (+ trace)", str(d["hit_tokens_learning"]),
                      f"{d['hit_rate_learning']:.1%}")  # fmt: skip
        console.print(table)
        if d["hashes_compatible"] is False:
            err_console.print("[yellow]warning:[/] the stream's block hashes are not TokenSpeed's "
                              "rolling hash; trace prompts cannot match them")  # fmt: skip


# ---- the command -----------------------------------------------------------------------------
def replay_kv_events(
    endpoint: Annotated[
        str | None, typer.Option(help="Publisher's PUB endpoint, e.g. tcp://127.0.0.1:5557.")
    ] = None,
    from_file: Annotated[
        Path | None, typer.Option("--from", help="Read a recording instead of subscribing.")
    ] = None,
    record: Annotated[
        Path | None, typer.Option(help="Write every received message to this recording.")
    ] = None,
    duration: Annotated[
        float | None, typer.Option(min=0.0, help="Listen this many seconds (live only).")
    ] = None,
    max_events: Annotated[
        int | None, typer.Option(min=1, help="Stop after this many events (live only).")
    ] = None,
    replay_endpoint: Annotated[
        str | None,
        typer.Option(help="Publisher's replay (ROUTER) endpoint: fetch history from --since."),
    ] = None,
    since: Annotated[
        int, typer.Option(min=0, help="First sequence number to fetch from the replay endpoint.")
    ] = 0,
    topic: Annotated[str, typer.Option(help="Topic to subscribe to (prefix match).")] = "",
    trace: Annotated[
        Path | None,
        typer.Option(help="JSONL request trace: simulate a KV-aware router's prefix hit rate."),
    ] = None,
    tokenizer: Annotated[
        Path | None, typer.Option(help="Model directory whose tokenizer encodes text traces.")
    ] = None,
    url: Annotated[
        str | None, typer.Option(help="Server URL whose model's tokenizer encodes text traces.")
    ] = None,
    block_size: Annotated[
        int | None, typer.Option(min=1, help="Block size for --trace if the stream has none.")
    ] = None,
    check_hashes: Annotated[
        bool, typer.Option(help="Verify hash chains against TokenSpeed's rolling hash.")
    ] = False,
    strict: Annotated[bool, typer.Option(help="Exit 1 when validation finds an issue.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
) -> None:
    """Rebuild and validate the KV block index from a live event stream or a recording."""
    live = endpoint is not None or replay_endpoint is not None
    if live == (from_file is not None):
        fail("give either --endpoint/--replay-endpoint (live) or --from RECORDING")
    if from_file is not None and (record or duration is not None or max_events is not None):
        fail("--record, --duration and --max-events apply to a live stream, not to --from")
    check = _rolling_hash() if check_hashes else None
    try:
        if from_file is not None:
            recording = read_recording(from_file)
            index = BlockIndex(check, expect_seq=recording.header.get("since"))
            _consume(iter(recording.messages), index, None, None)
            source = str(from_file)
            if recording.truncated:
                err_console.print(f"[yellow]warning:[/] {from_file} ends with a partial record "
                                  "(the recorder was interrupted); it was ignored")  # fmt: skip
        else:
            index = BlockIndex(check, expect_seq=since if replay_endpoint else None)
            source = endpoint or str(replay_endpoint)
            sub = Subscriber(endpoint, replay_endpoint, topic)
            try:
                first = since if replay_endpoint else None
                writer = RecordingWriter(record, source, topic, first) if record else None
                if not as_json and endpoint and duration is None and max_events is None:
                    err_console.print(f"listening on {endpoint}; Ctrl-C to stop")
                try:
                    _consume(_live_messages(sub, first, duration), index, writer, max_events)
                except KeyboardInterrupt:  # Ctrl-C between two messages: same as inside one
                    pass
                finally:
                    if writer is not None:
                        writer.close()
            finally:
                sub.close()
        sim = None
        if trace is not None:
            sim = _simulate(trace, index, block_size, _tokenizer_loader(tokenizer, url))
    except (RecordingError, SubscriberError, MalformedEvent, TraceError, ServerError) as e:
        fail(str(e))
    except OSError as e:
        fail(f"{getattr(e, 'filename', None) or 'file'}: {e.strerror or e}")
    summary = index.summary()
    if as_json:
        out: dict[str, Any] = {"source": source, "recording": str(record) if record else None,
                               "stats": summary}  # fmt: skip
        if sim is not None:
            out["simulation"] = sim.to_dict()
        typer.echo(json.dumps(out))
    else:
        _render(source, summary, sim)
    if strict and not summary["valid"]:
        raise typer.Exit(1)
