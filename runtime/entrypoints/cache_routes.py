"""``GET /cache/snapshot``: the engine's prefix tree as JSON, for ``tokenspeed inspect-cache``.

The engine answers between two steps with the scheduler's ``cache_snapshot`` (entries are
single-child chains of pages with the same residency and lock count, breadth first), after
publishing any pending KV events, so ``kv_events_seq`` names the last event batch the snapshot
already reflects. The server adds a decoded text snippet per entry (the CLI may run where the
tokenizer is not) and the facts a reader needs to interpret it (model, page size, capacity).

Block hashes are unsigned 64-bit integers; JSON carries them exactly (Python reads them back as
ints), though JavaScript numbers would round them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Query, Request

from tokenspeed.runtime.entrypoints import ipc
from tokenspeed.runtime.entrypoints.engine_client import EngineDeadError
from tokenspeed.runtime.entrypoints.openai_protocol import OpenAIError

router = APIRouter()

#: Tokens decoded per entry for its text snippet.
SNIPPET_TOKENS = 48
#: Upper bound on `max_nodes` (the whole tree of a big pool is still far below this).
MAX_NODES_LIMIT = 1_000_000


def _add_snippets(snapshot: dict[str, Any], tokenizer: Any, snippet_tokens: int) -> None:
    """Give each entry `text`: its first `snippet_tokens` tokens decoded (special tokens kept)."""
    for node in snapshot.get("nodes", []):
        ids = node.get("token_ids") or []
        if not ids or tokenizer is None:
            node["text"] = ""
            continue
        try:
            node["text"] = tokenizer.decode(ids[:snippet_tokens], skip_special_tokens=False)
        except Exception:  # a snippet is decoration; never fail the snapshot for it
            node["text"] = ""
        node["text_truncated"] = len(ids) > snippet_tokens


@router.get("/cache/snapshot")
async def cache_snapshot(
    request: Request,
    max_nodes: int = Query(4096, ge=1, le=MAX_NODES_LIMIT),
    snippet_tokens: int = Query(SNIPPET_TOKENS, ge=0, le=4096),
) -> dict[str, Any]:
    """The prefix tree (at most `max_nodes` entries, breadth first) with text snippets."""
    state = request.app.state.server
    try:
        snapshot = await state.llm.engine.query(ipc.CACHE_SNAPSHOT, max_nodes=max_nodes)
    except (EngineDeadError, TimeoutError) as e:
        raise OpenAIError(
            f"cache snapshot unavailable: {e or 'the engine did not answer'}",
            status=503,
            type="server_error",
        ) from None
    await asyncio.to_thread(_add_snippets, snapshot, state.tokenizer, snippet_tokens)
    info = state.engine_info
    return {
        "object": "cache_snapshot",
        "created": time.time(),
        "model": state.model_name,
        "model_path": info.get("model_path"),
        "kv_capacity": info.get("kv_capacity", {}),
        **snapshot,
    }
