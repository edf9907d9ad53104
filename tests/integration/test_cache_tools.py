"""inspect-cache and replay-kv-events against a real tiny-model server publishing KV events.

One server per module (small KV pool, so the workload also evicts), one workload with shared
prefixes recorded live by ``replay-kv-events --record`` in a subprocess (stopped with Ctrl-C once
it holds the batch the snapshot names), then: the index rebuilt from the events must equal the
device blocks of the server's own cache snapshot.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from serving_helpers import MODEL, Server, free_port, scheduler_built, start_server
from typer.testing import CliRunner

from tokenspeed_cli.inspect_cache import inspect_cache
from tokenspeed_cli.kv_events.cli import replay_kv_events
from tokenspeed_cli.kv_events.index import BlockIndex
from tokenspeed_cli.kv_events.recording import RecordingError, read_recording
from tokenspeed_cli.kv_events.wire import decode_batch

SYSTEM = (
    "You are TokenSpeed's careful assistant. Answer briefly, cite the tool output you used, "
    "and never invent file names. The tools are: search, read_file, run_tests. "
)
QUESTIONS = ["What does the scheduler do?", "How are pages evicted?", "Why chained hashes?",
             "Where do events go?"]  # fmt: skip
DETAIL = " Please explain it in detail, with two examples from the code base and their tests."

APP_SOURCE = (
    "import typer; from tokenspeed_cli.kv_events.cli import replay_kv_events; "
    "app = typer.Typer(); app.command()(replay_kv_events); app()"
)

app = typer.Typer()
app.command("inspect-cache")(inspect_cache)
app.command("replay-kv-events")(replay_kv_events)
runner = CliRunner()


def cli(*args: str) -> Any:
    """Run one of the two commands in-process."""
    return runner.invoke(app, list(args))


@dataclass
class Session:
    """The server, its endpoints, and what the recorded workload left behind."""

    server: Server
    endpoint: str
    replay_endpoint: str
    recording: Path
    recorder_stats: dict[str, Any]
    snapshot: dict[str, Any]


def _complete(server: Server, prompt: str, max_tokens: int = 4) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _recorded_through(path: Path, seq: int) -> bool:
    try:
        return any(m.seq >= seq for m in read_recording(path).messages)
    except RecordingError:
        return False


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    if not scheduler_built():
        pytest.skip("the C++ scheduler (tokenspeed.scheduler.Scheduler) is not built")
    tmp = tmp_path_factory.mktemp("cache-tools")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    replay = f"tcp://127.0.0.1:{free_port()}"
    config = {"endpoint": endpoint, "replay_endpoint": replay, "topic": "kv"}
    server = start_server(
        tmp,
        "--max-total-tokens", "1024",
        "--max-model-len", "512",
        "--kv-events-config", json.dumps(config),
    )  # fmt: skip
    recording = tmp / "events.tskv"
    cmd = [sys.executable, "-c", APP_SOURCE, "--endpoint", endpoint, "--replay-endpoint", replay,
           "--topic", "kv", "--record", str(recording), "--check-hashes", "--json"]  # fmt: skip
    recorder = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not recording.exists():  # the header is written once both sockets are connected
            assert recorder.poll() is None and time.monotonic() < deadline, recorder.stderr.read()
            time.sleep(0.05)
        for i in range(6):  # long unrelated prompts: the 64-page pool must evict
            _complete(server, f"Log dump {i}: " + " ".join(f"line{i}-{k}" for k in range(35)))
        for q in [*QUESTIONS, QUESTIONS[0]]:  # a shared system prompt, evicting old dumps
            _complete(server, SYSTEM + q + DETAIL)
        snapshot = httpx.get(f"{server.url}/cache/snapshot", timeout=30).json()
        seq = snapshot["kv_events_seq"]
        deadline = time.monotonic() + 20
        while not _recorded_through(recording, seq) and time.monotonic() < deadline:
            time.sleep(0.1)
        recorder.send_signal(signal.SIGINT)
        out, err = recorder.communicate(timeout=30)
        assert recorder.returncode == 0, err
        yield Session(server, endpoint, replay, recording, json.loads(out)["stats"], snapshot)
    finally:
        if recorder.poll() is None:
            recorder.kill()
            recorder.wait()
        server.stop()


def _device_blocks(snapshot: dict[str, Any]) -> set[int]:
    assert not snapshot["truncated"]
    return {h for n in snapshot["nodes"] if n["device_pages"] for h in n["block_hashes"]}


def test_index_from_recorded_events_equals_the_server_snapshot(session: Session) -> None:
    rec = read_recording(session.recording)
    seq = session.snapshot["kv_events_seq"]
    index = BlockIndex(expect_seq=0)
    for m in rec.messages:
        if m.seq <= seq:
            index.apply(decode_batch(m.seq, m.payload))
    summary = index.summary()
    assert summary["valid"], summary
    assert summary["events"].get("BlockRemoved", 0) > 0, "the workload should evict"
    expected = _device_blocks(session.snapshot)
    assert len(expected) == session.snapshot["device_pages"] > 0
    assert index.live("GPU") == expected
    # The recorder's own report (hash chains checked against the scheduler's rolling hash).
    stats = session.recorder_stats
    assert stats["valid"] and stats["first_seq"] == 0 and stats["last_seq"] >= seq
    assert stats["blocks_live"]["GPU"] == len(expected)


def test_history_from_the_replay_socket_alone(session: Session) -> None:
    out = cli("replay-kv-events", "--replay-endpoint", session.replay_endpoint, "--json")
    assert out.exit_code == 0, out.output
    stats = json.loads(out.stdout)["stats"]
    assert stats["valid"] and stats["first_seq"] == 0
    assert stats["blocks_live"]["GPU"] == len(_device_blocks(session.snapshot))
    again = cli("replay-kv-events", "--from", str(session.recording))
    assert again.exit_code == 0 and "stream valid" in again.output


def test_inspect_cache_shows_the_shared_prefix(session: Session, tmp_path: Path) -> None:
    saved = tmp_path / "snap.json"
    live = cli("inspect-cache", "--url", session.server.url, "--json", "--save", str(saved))
    assert live.exit_code == 0, live.output
    summary = json.loads(live.stdout)["summary"]
    top = summary["shared_prefixes"][0]
    assert top["depth"] == 1 and top["hits"] >= len(QUESTIONS) - 1 and top["branches"] >= 2
    assert top["snippet"].startswith("You are TokenSpeed's careful assistant")
    assert summary["device_pages"] == session.snapshot["device_pages"]
    assert summary["evictable_device_pages"] == summary["device_pages"]  # nothing running
    from_file = cli("inspect-cache", "--from", str(saved), "--json")
    assert json.loads(from_file.stdout)["summary"] == summary
    text = cli("inspect-cache", "--from", str(saved), "--tree", "--depth", "2")
    assert text.exit_code == 0
    assert "Most shared prefixes" in text.output and "You are TokenSpeed" in text.output
    assert "hits=" in text.output


def test_router_simulation_on_a_text_trace(session: Session, tmp_path: Path) -> None:
    from tokenspeed.runtime.tokenizer import Tokenizer
    from tokenspeed.scheduler import rolling_hash

    trace = tmp_path / "trace.jsonl"
    prompts = [SYSTEM + "A new question?", "Entirely unrelated words here."]
    trace.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    out = cli("replay-kv-events", "--from", str(session.recording), "--trace", str(trace),
              "--url", session.server.url, "--json")  # fmt: skip
    assert out.exit_code == 0, out.output
    sim = json.loads(out.stdout)["simulation"]
    # Independently: the server's tokenizer, the scheduler's hash, the snapshot's blocks.
    info = httpx.get(f"{session.server.url}/get_server_info", timeout=30).json()
    tokenizer = Tokenizer.from_dir(info["engine"]["model_path"])
    blocks, page = _device_blocks(session.snapshot), session.snapshot["page_size"]
    expected = []
    for p in prompts:
        ids = tokenizer.encode(p)
        n = 0
        for h in rolling_hash(ids[:-1], page, 0):
            if h not in blocks:
                break
            n += 1
        expected.append(n * page)
    assert [r["hit_tokens"] for r in sim["per_request"]] == expected
    assert expected[0] > 0 and expected[1] == 0


def test_snapshot_endpoint_limits(session: Session) -> None:
    small = httpx.get(f"{session.server.url}/cache/snapshot", params={"max_nodes": 1}).json()
    assert small["truncated"] and len(small["nodes"]) == 1
    bad = httpx.get(f"{session.server.url}/cache/snapshot", params={"max_nodes": 0})
    assert bad.status_code == 400 and "error" in bad.json()


def test_errors_are_one_line(session: Session, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    cases = [
        (["inspect-cache", "--url", dead], "cannot reach a server"),
        (["inspect-cache", "--url", session.server.url + "/v1"], "a TokenSpeed server?"),
        (["inspect-cache", "--url", "localhost:8000"], "is not an http(s) URL"),
        (["inspect-cache", "--from", str(session.recording)], "is not a cache snapshot file"),
        (["replay-kv-events", "--endpoint", f"tcp://127.0.0.1:{free_port()}"],
         "nothing is listening"),
    ]  # fmt: skip
    for args, message in cases:
        out = cli(*args)
        assert out.exit_code == 2, (args, out.output)
        assert message in out.output and "Traceback" not in out.output
        assert len(out.output.strip().splitlines()) == 1, out.output


def test_a_bad_kv_events_config_stops_the_server_with_one_message(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError) as info:
        start_server(tmp_path, "--kv-events-config", '{"endpiont": "tcp://127.0.0.1:1"}')
    log = str(info.value)
    assert "kv_events_config: unknown key 'endpiont'" in log and "Traceback" not in log
