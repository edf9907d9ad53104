"""``replay-kv-events --from``: statistics, validation exit codes, router simulation, errors."""

from __future__ import annotations

import json
import random
from pathlib import Path

import typer
from kv_driver import Driver, shared_prefix_workload
from typer.testing import CliRunner

from tokenspeed.scheduler import rolling_hash
from tokenspeed_cli.kv_events.cli import replay_kv_events
from tokenspeed_cli.kv_events.recording import RawMessage, RecordingWriter

app = typer.Typer()
app.command()(replay_kv_events)
runner = CliRunner()


def record(path: Path, payloads: list[bytes], skip: set[int] = frozenset()) -> None:
    with RecordingWriter(path, "test", "", since=0) as writer:
        for seq, payload in enumerate(payloads):
            if seq not in skip:
                writer.write(RawMessage(seq, b"", payload, 0.0))


def test_recording_statistics_and_simulation(tmp_path: Path, rng: random.Random) -> None:
    driver = Driver(device_pages=400)
    prompts = shared_prefix_workload(driver, rng, groups=2, per_group=3)
    driver.run(rng)
    rec, trace = tmp_path / "r.tskv", tmp_path / "t.jsonl"
    record(rec, driver.batches)
    trace.write_text("".join(json.dumps({"token_ids": p}) + "\n" for p in prompts))
    out = runner.invoke(app, ["--from", str(rec), "--trace", str(trace), "--json",
                              "--check-hashes", "--strict"])  # fmt: skip
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    stats, sim = data["stats"], data["simulation"]
    assert stats["valid"] and stats["batches"] == len(driver.batches)
    assert stats["blocks_live"]["GPU"] == len(driver.snapshot_blocks()["GPU"])
    # Nothing was evicted, so every prompt's full pages of prompt[:-1] are cached.
    expected = sum(len(rolling_hash(p[:-1], 4, 0)) * 4 for p in prompts)
    assert sim["hit_tokens"] == expected and sim["hashes_compatible"] is True
    text = runner.invoke(app, ["--from", str(rec), "--trace", str(trace)])
    assert text.exit_code == 0
    assert "stream valid" in text.output and "Router simulation" in text.output


def test_gaps_are_reported_and_strict_fails(tmp_path: Path, rng: random.Random) -> None:
    driver = Driver(device_pages=40)
    shared_prefix_workload(driver, rng)
    driver.run(rng)
    rec = tmp_path / "gappy.tskv"
    record(rec, driver.batches, skip={2, 3})
    out = runner.invoke(app, ["--from", str(rec), "--json"])
    stats = json.loads(out.stdout)["stats"]
    assert out.exit_code == 0
    assert stats["gaps"] == [[2, 3]] and not stats["valid"]
    strict = runner.invoke(app, ["--from", str(rec), "--strict"])
    assert strict.exit_code == 1 and "sequence_gap" in strict.output


def test_usage_and_file_errors_are_one_line(tmp_path: Path) -> None:
    snapshot = tmp_path / "snap.json"
    snapshot.write_text("{}")
    bad_trace = tmp_path / "t.jsonl"
    bad_trace.write_text("nope\n")
    rec = tmp_path / "r.tskv"
    record(rec, [])
    cases = [
        ([], "give either --endpoint"),
        (["--from", str(rec), "--endpoint", "tcp://127.0.0.1:1"], "give either"),
        (["--from", str(rec), "--duration", "1"], "apply to a live stream"),
        (["--from", str(snapshot)], "is not a KV-event recording"),
        (["--from", str(tmp_path / "none")], "cannot read"),
        (["--from", str(rec), "--trace", str(bad_trace)], "t.jsonl:1: not JSON"),
        (["--from", str(rec), "--trace", str(tmp_path / "none.jsonl")], "cannot read the trace"),
    ]
    for args, message in cases:
        out = runner.invoke(app, args)
        assert out.exit_code == 2, (args, out.output)
        assert message in out.output and "Traceback" not in out.output, out.output
    # A valid trace against an empty stream needs a block size.
    good = tmp_path / "g.jsonl"
    good.write_text('{"token_ids": [1, 2, 3]}\n')
    out = runner.invoke(app, ["--from", str(rec), "--trace", str(good)])
    assert out.exit_code == 2 and "--block-size" in out.output
    out = runner.invoke(app, ["--from", str(rec), "--trace", str(good), "--block-size", "2",
                              "--json"])  # fmt: skip
    assert out.exit_code == 0 and json.loads(out.stdout)["simulation"]["hit_tokens"] == 0
