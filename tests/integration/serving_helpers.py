"""Starting the real `tokenspeed serve` process for integration tests, and looking at it (and
at what it streams).

The subprocess inherits the environment, including the private model cache that
tests/conftest.py sets.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = "tokenspeed-tiny"


def scheduler_built() -> bool:
    import tokenspeed.scheduler as sched

    return hasattr(sched, "Scheduler")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children_of(pid: int) -> list[int]:
    """Direct children of a process (from /proc; Linux)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...; comm may hold spaces, so split after the last ')'
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            out.append(int(entry.name))
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@dataclass
class Server:
    """A running `tokenspeed serve` process and how to reach it."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def engine_pids(self) -> list[int]:
        return children_of(self.proc.pid)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


def start_server(tmp: Path, *flags: str, timeout: float = 120.0) -> Server:
    """Launch `python -m tokenspeed_cli.main serve` and wait until /health answers 200."""
    port = free_port()
    log_path = tmp / f"server-{port}.log"
    cmd = [sys.executable, "-m", "tokenspeed_cli.main", "serve", "--port", str(port), *flags]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=REPO_ROOT, env=os.environ.copy(), stdout=log, stderr=subprocess.STDOUT
        )
    server = Server(proc, port, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()}")
        try:
            if httpx.get(f"{server.url}/health", timeout=1.0).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"server not healthy after {timeout} s:\n{server.log()}")


def no_whitespace_bias() -> dict[str, int]:
    """logit_bias banning every tiny-model token with whitespace in it: its random weights
    would otherwise fill JSON's optional whitespace until max_tokens."""
    from tokenspeed.runtime.tiny_model import ensure_tiny_model
    from tokenspeed.runtime.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(ensure_tiny_model())
    spaced = [i for i in range(tok.vocab_size) if any(c.isspace() for c in tok.decode([i]))]
    return {str(i): -100 for i in spaced}


def accumulate_tool_calls(deltas: list[Any]) -> list[dict[str, str]]:
    """Streamed `tool_calls` deltas joined as a client joins them: by index, the first delta
    of a call with its id and name, the rest adding to its arguments."""
    calls: list[dict[str, str]] = []
    for tc in (tc for d in deltas for tc in d.tool_calls or []):
        if tc.index == len(calls):
            assert tc.id and tc.type == "function" and tc.function.name
            calls.append({"id": tc.id, "name": tc.function.name, "arguments": ""})
        assert tc.index == len(calls) - 1  # calls arrive one after another
        calls[-1]["arguments"] += tc.function.arguments or ""
    return calls
