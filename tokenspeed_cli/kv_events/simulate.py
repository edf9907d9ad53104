"""Router simulation: the prefix hit rate a KV-aware router would see for a request trace.

A KV-aware router keeps the block index of each worker (rebuilt from its KV events) and, for a
request, walks the request's chained page hashes (the same ``rolling_hash`` the scheduler keys
its radix tree on) until the first one the worker does not hold. Like the scheduler, only full
pages of ``prompt[:-1]`` can match (the last prompt token is always computed, for its logits).

The trace is JSON Lines, one request per line, with one of ``token_ids`` /
``prompt_token_ids`` (ids), ``prompt`` / ``text`` (a string, tokenised like ``/v1/completions``
does) or ``messages`` (chat, tokenised with the chat template). Three rates are reported, each
as matched tokens over prompt tokens: against the index as rebuilt (device tier), against any
tier (host hits cost a load-back, not a recompute), and "learning", where every trace request
also adds its own prompt pages to the index before the next one (no eviction), which is what
the trace would get from a warm, large enough cache.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenspeed_cli.kv_events.index import BlockIndex

HashFn = Callable[[Sequence[int], int, int], list[int]]


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file and line."""


def _default_hash() -> HashFn:
    from tokenspeed.scheduler import rolling_hash

    return rolling_hash  # type: ignore[return-value]


def load_trace(path: Path, tokenizer_loader: Callable[[], Any] | None = None) -> list[list[int]]:
    """Each request's prompt token ids; the tokenizer is loaded only if a line has text."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"cannot read the trace {path}: {getattr(e, 'strerror', None) or e}") \
            from None  # fmt: skip
    tokenizer: Any = None
    prompts: list[list[int]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{where}: expected a JSON object per line")
        ids = obj.get("token_ids", obj.get("prompt_token_ids"))
        if ids is not None:
            if not isinstance(ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids
            ):
                raise TraceError(f"{where}: token_ids must be a list of non-negative ints")
            prompts.append(ids)
            continue
        text, messages = obj.get("prompt", obj.get("text")), obj.get("messages")
        if text is None and messages is None:
            raise TraceError(f"{where}: needs token_ids, prompt or messages")
        if tokenizer is None:
            if tokenizer_loader is None:
                raise TraceError(f"{where}: has text; give --tokenizer DIR or the server's --url")
            tokenizer = tokenizer_loader()
        if isinstance(text, str):
            prompts.append(list(tokenizer.encode(text)))
        elif isinstance(messages, list) and all(isinstance(m, dict) for m in messages):
            prompts.append(list(tokenizer.encode_chat(messages)))
        else:
            raise TraceError(f"{where}: prompt must be a string and messages a list of objects")
    if not prompts:
        raise TraceError(f"the trace {path} has no requests")
    return prompts


@dataclass
class SimulationResult:
    """Matched tokens per request and in total, for the three views (see the module doc)."""

    block_size: int
    prompt_tokens: int = 0
    hit_tokens: int = 0
    hit_tokens_any_tier: int = 0
    hit_tokens_learning: int = 0
    requests_with_hit: int = 0
    per_request: list[dict[str, int]] = field(default_factory=list)
    hashes_compatible: bool | None = None

    def rate(self, hits: int) -> float:
        """Matched over prompt tokens."""
        return hits / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain data for `--json`."""
        return {
            "requests": len(self.per_request),
            "block_size": self.block_size,
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "hit_rate": self.rate(self.hit_tokens),
            "hit_tokens_any_tier": self.hit_tokens_any_tier,
            "hit_rate_any_tier": self.rate(self.hit_tokens_any_tier),
            "hit_tokens_learning": self.hit_tokens_learning,
            "hit_rate_learning": self.rate(self.hit_tokens_learning),
            "requests_with_hit": self.requests_with_hit,
            "hashes_compatible": self.hashes_compatible,
            "per_request": self.per_request,
        }


def matched_pages(hashes: Sequence[int], live: set[Any] | dict[Any, Any]) -> int:
    """How many leading hashes are present: the router's longest cached prefix, in pages."""
    n = 0
    for h in hashes:
        if h not in live:
            break
        n += 1
    return n


def hashes_compatible(index: BlockIndex, hash_fn: HashFn, sample: int = 32) -> bool | None:
    """Whether the stream's hashes are `hash_fn`'s (None when no block is live to check)."""
    checked = 0
    for tier in index.blocks.values():
        for h, block in tier.items():
            if not isinstance(h, int) or not isinstance(block.parent, int | None):
                return False
            if hash_fn(list(block.token_ids), block.block_size, block.parent or 0) != [h]:
                return False
            checked += 1
            if checked >= sample:
                return True
    return True if checked else None


def simulate(
    prompts: list[list[int]],
    index: BlockIndex,
    block_size: int,
    hash_fn: HashFn | None = None,
    device_medium: str = "GPU",
) -> SimulationResult:
    """Replay `prompts` against the rebuilt `index`; see the module docstring for the views."""
    fn = hash_fn or _default_hash()
    device = index.live(device_medium)
    anywhere = index.live()
    learned = set(device)
    result = SimulationResult(block_size, hashes_compatible=hashes_compatible(index, fn))
    for i, prompt in enumerate(prompts):
        hashes = fn(prompt[:-1], block_size, 0) if len(prompt) > 1 else []
        hit = matched_pages(hashes, device) * block_size
        hit_any = matched_pages(hashes, anywhere) * block_size
        hit_learning = matched_pages(hashes, learned) * block_size
        learned.update(fn(prompt, block_size, 0))
        result.prompt_tokens += len(prompt)
        result.hit_tokens += hit
        result.hit_tokens_any_tier += hit_any
        result.hit_tokens_learning += hit_learning
        result.requests_with_hit += hit > 0
        result.per_request.append({"request": i, "prompt_tokens": len(prompt), "hit_tokens": hit,
                                   "hit_tokens_learning": hit_learning})  # fmt: skip
    return result
