"""``tokenspeed inspect-cache``: what a server's prefix cache holds, from a live server or a file.

The server's ``GET /cache/snapshot`` returns the radix tree as entries (single-child chains of
pages with the same residency and lock count), breadth first, each with its tokens, block hashes,
device/host pages, lock and hit counts and a decoded text snippet. This command summarises it
(pages per tier, locked vs evictable, entries per tree level, the most shared prefixes), draws
it as a tree, prints JSON, or saves it to a file that ``--from`` reads back.

Registered on the main app as ``app.command("inspect-cache")(inspect_cache)``.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from tokenspeed_cli.console import console, fail
from tokenspeed_cli.kv_events.server_api import ServerError, get_json

__all__ = ["inspect_cache", "summarize", "load_snapshot_file", "SnapshotError"]

FILE_FORMAT = "tokenspeed-cache-snapshot"
FILE_VERSION = 1
SNIPPET_CHARS = 60
TREE_CHILDREN = 12


class SnapshotError(ValueError):
    """Data that is not a cache snapshot; the message says what is wrong."""


def check_snapshot(snapshot: Any, where: str) -> dict[str, Any]:
    """`snapshot` if it has the fields a summary needs; `SnapshotError` otherwise."""
    if not isinstance(snapshot, dict):
        raise SnapshotError(f"{where} is not a cache snapshot (not a JSON object)")
    nodes = snapshot.get("nodes")
    if not isinstance(nodes, list) or not isinstance(snapshot.get("page_size"), int):
        raise SnapshotError(f"{where} is not a cache snapshot (no nodes / page_size)")
    for i, node in enumerate(nodes):
        if not isinstance(node, dict) or not isinstance(node.get("id"), int):
            raise SnapshotError(f"{where}: node {i} is not a snapshot entry")
        for key in ("block_hashes", "device_pages", "host_pages"):
            if not isinstance(node.get(key, []), list):
                raise SnapshotError(f"{where}: node {i} has a malformed {key}")
    return snapshot


def load_snapshot_file(path: Path) -> dict[str, Any]:
    """The snapshot inside a file written by ``--save``; `SnapshotError` for anything else."""
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise SnapshotError(f"cannot read {path}: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise SnapshotError(f"{path} is not a cache snapshot file (not JSON)") from None
    if not isinstance(data, dict) or data.get("format") != FILE_FORMAT:
        raise SnapshotError(f"{path} is not a cache snapshot file (saved by inspect-cache --save)")
    if data.get("version") != FILE_VERSION:
        raise SnapshotError(f"{path}: unsupported snapshot file version {data.get('version')!r}")
    return check_snapshot(data.get("snapshot"), str(path))


def save_snapshot_file(path: Path, snapshot: dict[str, Any], source: str) -> None:
    """Write `snapshot` with a small header, for ``--from``."""
    body = {"format": FILE_FORMAT, "version": FILE_VERSION, "saved_at": time.time(),
            "source": source, "snapshot": snapshot}  # fmt: skip
    path.write_text(json.dumps(body))


# ---- the summary -----------------------------------------------------------------------------
def _entries(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """Snapshot entries without the root."""
    return [n for n in snapshot["nodes"] if n.get("parent_id") is not None]


def _leaves_below(entries: list[dict[str, Any]]) -> dict[int, int]:
    """Leaf entries in each entry's subtree (itself if a leaf): how many branches share it."""
    children: dict[Any, list[int]] = defaultdict(list)
    for e in entries:
        children[e["parent_id"]].append(e["id"])
    leaves: dict[int, int] = {}
    for e in reversed(entries):  # breadth first, so children come after their parent
        kids = children.get(e["id"], [])
        leaves[e["id"]] = sum(leaves.get(k, 0) for k in kids) if kids else 1
    return leaves


def _snippet(entry: dict[str, Any]) -> str:
    text = entry.get("text")
    if text is None:  # a snapshot without decoded text: show the first token ids
        ids = entry.get("token_ids") or []
        text = " ".join(map(str, ids[:12])) + (" ..." if len(ids) > 12 else "")
    text = " ".join(str(text).split())
    if len(text) > SNIPPET_CHARS:
        text = text[: SNIPPET_CHARS - 1] + "…"
    lead = f"[+{entry.get('prefix_len', 0)}] " if entry.get("prefix_len") else ""
    return lead + text


def summarize(snapshot: dict[str, Any], top: int = 10) -> dict[str, Any]:
    """Counts, tree levels and the most shared prefixes, as plain data (the ``--json`` output)."""
    entries = _entries(snapshot)
    leaves = _leaves_below(entries)
    pages = sum(len(e.get("block_hashes", [])) for e in entries)
    device = int(snapshot.get("device_pages", sum(len(e["device_pages"]) for e in entries)))
    host = int(snapshot.get("host_pages", sum(len(e["host_pages"]) for e in entries)))
    locked = int(snapshot.get("locked_device_pages", 0))
    levels: dict[int, Counter[str]] = defaultdict(Counter)
    for e in entries:
        level = levels[int(e.get("depth", 0))]
        level["entries"] += 1
        level["pages"] += len(e.get("block_hashes", []))
        level["device_pages"] += len(e.get("device_pages", []))
        level["host_pages"] += len(e.get("host_pages", []))
    ranked = sorted(
        entries,
        key=lambda e: (-int(e.get("hit_count", 0)), -leaves[e["id"]], e.get("prefix_len", 0)),
    )
    shared = [
        {
            "id": e["id"],
            "depth": e.get("depth"),
            "prefix_tokens": int(e.get("prefix_len", 0)) + len(e.get("token_ids") or []),
            "tokens": len(e.get("token_ids") or []),
            "pages": len(e.get("block_hashes", [])),
            "device_pages": len(e.get("device_pages", [])),
            "host_pages": len(e.get("host_pages", [])),
            "hits": int(e.get("hit_count", 0)),
            "branches": leaves[e["id"]],
            "locks": int(e.get("lock_count", 0)),
            "snippet": _snippet(e),
        }
        for e in ranked[:top]
        if e.get("hit_count", 0) or leaves[e["id"]] > 1
    ]
    capacity = snapshot.get("kv_capacity") or {}
    return {
        "model": snapshot.get("model"),
        "page_size": snapshot["page_size"],
        "entries": len(entries),
        "pages": int(snapshot.get("num_nodes", pages)),
        "device_pages": device,
        "device_pages_total": capacity.get("device_pages"),
        "host_pages": host,
        "host_pages_total": capacity.get("host_pages"),
        "locked_device_pages": locked,
        "evictable_device_pages": device - locked,
        "cached_tokens": device * snapshot["page_size"],
        "truncated": bool(snapshot.get("truncated", False)),
        "kv_events_seq": snapshot.get("kv_events_seq"),
        "depth_histogram": {str(d): dict(c) for d, c in sorted(levels.items())},
        "shared_prefixes": shared,
    }


# ---- rendering -------------------------------------------------------------------------------
def _render_summary(s: dict[str, Any], source: str) -> None:
    head = Table(title=f"Prefix cache of {s['model'] or 'the server'} ({source})",
                 show_header=False, title_justify="left")  # fmt: skip
    head.add_column(style="bold")
    head.add_column()
    total = f" of {s['device_pages_total']}" if s["device_pages_total"] else ""
    head.add_row("page size", f"{s['page_size']} tokens")
    head.add_row("entries / pages", f"{s['entries']} entries, {s['pages']} pages")
    head.add_row("device pages", f"{s['device_pages']}{total} ({s['cached_tokens']} tokens)")
    head.add_row("  locked", str(s["locked_device_pages"]))
    head.add_row("  evictable", str(s["evictable_device_pages"]))
    head.add_row("host pages", str(s["host_pages"]))
    if s["truncated"]:
        head.add_row("note", "[yellow]snapshot truncated: raise --max-nodes to see every entry[/]")
    console.print(head)

    levels = Table(title="Tree levels", title_justify="left")
    for col in ("depth", "entries", "pages", "device", "host"):
        levels.add_column(col, justify="right")
    for depth, c in s["depth_histogram"].items():
        levels.add_row(depth, *(str(c.get(k, 0)) for k in
                                ("entries", "pages", "device_pages", "host_pages")))  # fmt: skip
    console.print(levels)

    shared = Table(title="Most shared prefixes", title_justify="left")
    for col in ("id", "depth", "prefix tokens", "pages", "hits", "branches", "locks", "text"):
        shared.add_column(col, justify="left" if col == "text" else "right")
    for p in s["shared_prefixes"]:
        shared.add_row(str(p["id"]), str(p["depth"]), str(p["prefix_tokens"]), str(p["pages"]),
                       str(p["hits"]), str(p["branches"]), str(p["locks"]),
                       escape(p["snippet"]))  # fmt: skip
    if not s["shared_prefixes"]:
        shared.add_row("-", "", "", "", "", "", "", "no prefix has been reused yet")
    console.print(shared)


def _label(e: dict[str, Any]) -> str:
    tiers = "+".join(t for t, k in (("GPU", "device_pages"), ("CPU", "host_pages")) if e.get(k))
    lock = f" [red]locks={e['lock_count']}[/]" if e.get("lock_count") else ""
    return (f"[bold]{len(e.get('block_hashes', []))}p[/] {tiers or '-'} hits={e.get('hit_count', 0)}"
            f"{lock} [dim]{escape(_snippet(e))}[/]")  # fmt: skip


def _render_tree(snapshot: dict[str, Any], depth: int) -> None:
    entries = _entries(snapshot)
    children: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in entries:
        children[e["parent_id"]].append(e)
    roots = [n for n in snapshot["nodes"] if n.get("parent_id") is None]
    tree = Tree(f"[bold]prefix cache[/] ({len(entries)} entries)")

    def add(branch: Tree, parent_id: Any, level: int) -> None:
        kids = sorted(children.get(parent_id, []), key=lambda e: -int(e.get("hit_count", 0)))
        for e in kids[:TREE_CHILDREN]:
            node = branch.add(_label(e))
            if level < depth:
                add(node, e["id"], level + 1)
            elif children.get(e["id"]):
                node.add(f"[dim]… {len(children[e['id']])} more below (--depth)[/]")
        if len(kids) > TREE_CHILDREN:
            branch.add(f"[dim]… {len(kids) - TREE_CHILDREN} more[/]")

    for root in roots:
        add(tree, root["id"], 1)
    console.print(tree)


# ---- the command -----------------------------------------------------------------------------
def inspect_cache(
    url: Annotated[str, typer.Option(help="Server to ask.")] = "http://127.0.0.1:8000",
    from_file: Annotated[
        Path | None, typer.Option("--from", help="Read a snapshot saved with --save instead.")
    ] = None,
    tree: Annotated[bool, typer.Option("--tree", help="Draw the prefix tree.")] = False,
    depth: Annotated[int, typer.Option(min=1, help="Tree levels to draw with --tree.")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    save: Annotated[Path | None, typer.Option(help="Write the snapshot to this file.")] = None,
    max_nodes: Annotated[
        int, typer.Option(min=1, help="Entries to fetch (breadth first) from the server.")
    ] = 4096,
    top: Annotated[int, typer.Option(min=1, help="Shared prefixes to list.")] = 10,
) -> None:
    """Summarise a server's prefix cache: pages per tier, locks, levels, most shared prefixes."""
    try:
        if from_file is not None:
            snapshot, source = load_snapshot_file(from_file), str(from_file)
        else:
            snapshot = get_json(url, "/cache/snapshot", {"max_nodes": max_nodes})
            source = url.rstrip("/")
            check_snapshot(snapshot, f"{source}/cache/snapshot")
        if save is not None:
            save_snapshot_file(save, snapshot, source)
    except (ServerError, SnapshotError) as e:
        fail(str(e))
    except OSError as e:
        fail(f"cannot write {save}: {e.strerror or e}")
    summary = summarize(snapshot, top)
    if as_json:
        typer.echo(json.dumps({"source": source, "summary": summary}))
        return
    _render_summary(summary, source)
    if tree:
        _render_tree(snapshot, depth)
    if save is not None:
        console.print(f"saved the snapshot to {save}")
