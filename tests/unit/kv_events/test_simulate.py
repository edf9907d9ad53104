"""Router simulation math and trace parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenspeed.scheduler import rolling_hash
from tokenspeed_cli.kv_events.index import BlockIndex
from tokenspeed_cli.kv_events.simulate import TraceError, load_trace, matched_pages, simulate
from tokenspeed_cli.kv_events.wire import BlockRemoved, BlockStored, EventBatch

BS = 4
CACHED = list(range(100, 112))  # three full pages on the GPU


def index_with(cached: list[int], host: list[int] | None = None) -> BlockIndex:
    batch = [BlockStored(rolling_hash(cached, BS, 0), None, cached, BS)]
    if host:
        batch.append(BlockStored(rolling_hash(host, BS, 0), None, host, BS, None, "CPU"))
    return BlockIndex().apply_all([EventBatch(0, 0.0, batch, 0)])


def test_matched_pages_stops_at_the_first_miss() -> None:
    assert matched_pages([1, 2, 3], {1, 2, 3}) == 3
    assert matched_pages([1, 5, 3], {1, 2, 3}) == 1
    assert matched_pages([], {1}) == 0


def test_hit_tokens_follow_the_scheduler_rules() -> None:
    index = index_with(CACHED)
    prompts = [
        CACHED + [1, 2, 3],  # 15 tokens: 3 cached pages -> 12
        CACHED,  # 12 tokens: the last token is never reused -> only 2 pages -> 8
        CACHED[:6] + [7] * 9,  # diverges inside page 2 -> 1 page -> 4
        [9] * 20,  # nothing -> 0; then "learned": 5 pages of it
        [9] * 20,  # static 0, learning: prompt[:-1] = 19 tokens -> 4 pages -> 16
    ]
    result = simulate(prompts, index, BS)
    per = [r["hit_tokens"] for r in result.per_request]
    assert per == [12, 8, 4, 0, 0]
    assert [r["hit_tokens_learning"] for r in result.per_request] == [12, 8, 4, 0, 16]
    d = result.to_dict()
    assert d["prompt_tokens"] == 15 + 12 + 15 + 20 + 20
    assert d["hit_tokens"] == 24 and d["hit_rate"] == pytest.approx(24 / 82)
    assert d["hit_tokens_learning"] == 40 and d["requests_with_hit"] == 3
    assert d["hashes_compatible"] is True


def test_host_tier_counts_only_in_the_any_tier_view() -> None:
    index = index_with(CACHED[:4], host=CACHED)
    result = simulate([CACHED + [0]], index, BS).to_dict()
    assert result["hit_tokens"] == 4 and result["hit_tokens_any_tier"] == 12


def test_removed_blocks_no_longer_hit() -> None:
    index = index_with(CACHED)
    index.apply(EventBatch(1, 1.0, [BlockRemoved(rolling_hash(CACHED, BS, 0)[1:])], 0))
    assert simulate([CACHED + [0]], index, BS).hit_tokens == 4


def test_foreign_hashes_are_detected() -> None:
    index = BlockIndex().apply_all([EventBatch(0, 0.0, [BlockStored([1, 2], None, [0] * 8, 4)])])
    assert simulate([[0] * 9], index, BS).to_dict()["hashes_compatible"] is False


class FakeTokenizer:
    """One token per character, plus a chat form."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        return self.encode("|".join(m["content"] for m in messages))


def test_trace_formats(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    lines = [
        {"token_ids": [1, 2]},
        {"prompt_token_ids": [3]},
        {"prompt": "ab"},
        {"messages": [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}]},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    loads = []
    prompts = load_trace(path, lambda: loads.append(1) or FakeTokenizer())
    assert prompts == [[1, 2], [3], [97, 98], [120, 124, 121]]
    assert loads == [1]  # loaded once, lazily
    ids_only = tmp_path / "ids.jsonl"
    ids_only.write_text('{"token_ids": [1]}\n')
    assert load_trace(ids_only, None) == [[1]]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json\n", ":1: not JSON"),
        ("[1, 2]\n", ":1: expected a JSON object"),
        ('{"token_ids": [1]}\n{"token_ids": [-1]}\n', ":2: token_ids must be"),
        ('{"foo": 1}\n', ":1: needs token_ids, prompt or messages"),
        ('{"prompt": "hi"}\n', ":1: has text; give --tokenizer"),
        ("\n\n", "has no requests"),
    ],
)
def test_malformed_traces(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(content)
    with pytest.raises(TraceError) as info:
        load_trace(path, None)
    assert message in str(info.value)
    with pytest.raises(TraceError, match="cannot read the trace"):
        load_trace(tmp_path / "missing.jsonl", None)
