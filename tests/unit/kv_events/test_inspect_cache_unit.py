"""inspect-cache's summary and snapshot files, from a real scheduler's snapshot (no server)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import typer
from kv_driver import Driver, shared_prefix_workload
from typer.testing import CliRunner

from tokenspeed_cli.inspect_cache import (
    SnapshotError,
    inspect_cache,
    load_snapshot_file,
    save_snapshot_file,
    summarize,
)


@pytest.fixture
def snapshot(rng: random.Random) -> dict:
    driver = Driver(device_pages=400)
    shared_prefix_workload(driver, rng, groups=3, per_group=4)
    driver.run(rng)
    return driver.sched.cache_snapshot(10_000)


def test_summary_counts_and_most_shared_prefixes(snapshot: dict) -> None:
    s = summarize(snapshot, top=3)
    assert s["pages"] == snapshot["num_nodes"] == s["device_pages"]
    assert s["evictable_device_pages"] == s["device_pages"] - s["locked_device_pages"]
    assert s["entries"] == len(snapshot["nodes"]) - 1
    levels = s["depth_histogram"]
    assert sum(v["pages"] for v in levels.values()) == s["pages"]
    # The three system prompts are the most shared: 4 branches below each, hit by the later
    # prompts of their group (prompts admitted in the same step as the first one miss).
    top = s["shared_prefixes"]
    assert len(top) == 3
    assert [p["depth"] for p in top] == [1, 1, 1]
    assert all(p["branches"] == 4 and 1 <= p["hits"] <= 3 for p in top)
    assert [p["hits"] for p in top] == sorted((p["hits"] for p in top), reverse=True)
    assert {p["prefix_tokens"] for p in top} == {20, 24, 28}
    assert all(p["snippet"] for p in top)  # token ids when the snapshot has no text


def test_save_and_load_round_trip(tmp_path: Path, snapshot: dict) -> None:
    path = tmp_path / "snap.json"
    save_snapshot_file(path, snapshot, "test")
    assert summarize(load_snapshot_file(path)) == summarize(snapshot)


def test_files_that_are_not_snapshots(tmp_path: Path) -> None:
    cases = {
        "missing.json": None,
        "binary.json": b"\x00\xff",
        "list.json": b"[]",
        "other.json": json.dumps({"format": "something-else"}).encode(),
        "empty.json": json.dumps(
            {"format": "tokenspeed-cache-snapshot", "version": 1, "snapshot": {}}
        ).encode(),  # fmt: skip
        "nodes.json": json.dumps(
            {
                "format": "tokenspeed-cache-snapshot",
                "version": 1,
                "snapshot": {"page_size": 4, "nodes": [1]},
            }
        ).encode(),  # fmt: skip
    }
    for name, data in cases.items():
        if data is not None:
            (tmp_path / name).write_bytes(data)
        with pytest.raises(SnapshotError) as info:
            load_snapshot_file(tmp_path / name)
        assert name in str(info.value) and "\n" not in str(info.value)


def test_command_from_a_file(tmp_path: Path, snapshot: dict) -> None:
    app = typer.Typer()
    app.command()(inspect_cache)
    path = tmp_path / "snap.json"
    save_snapshot_file(path, snapshot, "test")
    runner = CliRunner()
    out = runner.invoke(app, ["--from", str(path), "--tree", "--depth", "1"])
    assert out.exit_code == 0, out.output
    assert "Most shared prefixes" in out.output and "prefix cache" in out.output
    assert "more below (--depth)" in out.output
    js = runner.invoke(app, ["--from", str(path), "--json"])
    assert json.loads(js.stdout)["summary"] == summarize(snapshot)
    bad = runner.invoke(app, ["--from", str(tmp_path / "nope.json")])
    assert bad.exit_code == 2 and "error:" in bad.output and "Traceback" not in bad.output
