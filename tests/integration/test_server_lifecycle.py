"""Starting and stopping `tokenspeed serve`: signals, in-flight streams, start-up failures.

These tests own their server processes (they kill them), so they do not share the module
fixture of the API tests.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from serving_helpers import MODEL, REPO_ROOT, alive, scheduler_built, start_server

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not scheduler_built(), reason="the C++ scheduler is not built"),
]


def _wait_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_ends_streams_and_leaves_no_child(tmp_path: Path, sig: int) -> None:
    server = start_server(tmp_path, "--max-total-tokens", "4096")
    engines = server.engine_pids()
    assert len(engines) == 1 and alive(engines[0])
    events: list[str] = []
    started = threading.Event()

    def stream() -> None:
        body = {"model": MODEL, "prompt": "keep going", "max_tokens": 3000, "stream": True,
                "ignore_eos": True}  # fmt: skip
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    started.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert started.wait(60)
    code = server.stop(sig)
    reader.join(30)
    assert not reader.is_alive()
    assert code == 0, server.log()
    # The in-flight stream ended with an error event, then [DONE].
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])
    assert error["error"]["type"] == "server_error"
    assert "shutting down" in error["error"]["message"]
    assert _wait_gone(engines) == []
    assert "Traceback" not in server.log()


def test_port_in_use_is_one_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "tokenspeed_cli.main", "serve", "--port", str(port)],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert out.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_bad_model_directory_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "not-a-model").mkdir()
    out = subprocess.run(
        [sys.executable, "-m", "tokenspeed_cli.main", "serve", str(tmp_path / "not-a-model")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode != 0
    assert "not a Hugging Face model directory" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_engine_failure_at_start_is_one_clear_error(tmp_path: Path) -> None:
    """A model directory whose weights are broken: the engine dies, the server says why."""
    from tokenspeed.runtime.model_source import resolve_model_path

    tiny = resolve_model_path(None)
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (broken / name).write_bytes((tiny / name).read_bytes())
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    port = str(_free_port())
    out = subprocess.run(
        [sys.executable, "-m", "tokenspeed_cli.main", "serve", str(broken), "--port", port],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert out.returncode == 1
    error_lines = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert len(error_lines) == 1
    assert "the engine failed to start" in error_lines[0]
    assert "Traceback" not in out.stderr + out.stdout
    # Nothing is left listening.
    with socket.socket() as s:
        s.bind(("127.0.0.1", int(port)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
