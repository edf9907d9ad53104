"""The engine process: receives requests over ZMQ, drives the EventLoop, streams token deltas back.

Run as `python -m tokenspeed.runtime.entrypoints.engine_process IPC_DIR` by the server. It never
imports the HTTP stack and never waits on it: between steps it drains whatever messages are
queued (without blocking while there is work), runs one step, and pushes one message with every
request's new tokens. It exits on a shutdown message, on SIGTERM, or when its parent dies, so a
killed server leaves no orphan behind. A failure is reported to the server in one message (set
TOKENSPEED_DEBUG=1 for the traceback).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import zmq

from tokenspeed.runtime.entrypoints import ipc

logger = logging.getLogger("tokenspeed.engine")

IDLE_POLL_MS = 100


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM us when the parent dies (the ppid check below covers the rest)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except OSError:
            pass


class EngineServer:
    """The engine side of the wire: one socket in, one out, one `EngineCore`."""

    def __init__(self, paths: ipc.IpcPaths, core: Any) -> None:
        self.core = core
        self.ctx = zmq.Context()
        self.inbox = self.ctx.socket(zmq.PULL)
        self.inbox.connect(paths.to_engine)
        self.outbox = self.ctx.socket(zmq.PUSH)
        self.outbox.setsockopt(zmq.LINGER, 2000)
        self.outbox.setsockopt(zmq.SNDHWM, 0)  # never block a step on a slow server
        self.outbox.connect(paths.from_engine)
        self.running = True
        self.parent = os.getppid()

    def send(self, message: dict[str, Any]) -> None:
        self.outbox.send(ipc.pack(message), copy=False)

    def handle(self, msg: dict[str, Any]) -> None:
        """Apply one message from the server."""
        kind = msg["type"]
        if kind == ipc.ADD:
            try:
                self.core.add_request(msg["rid"], msg["prompt_ids"], msg["params"], msg["arrival"])
            except ValueError as e:
                self.send({"type": ipc.REJECTED, "rid": msg["rid"], "message": str(e)})
        elif kind == ipc.ABORT:
            reason = msg.get("reason", "abort")
            for rid in msg["rids"]:
                self.core.abort_request(rid, reason)
        elif kind == ipc.STATS:
            data = self.core.stats(detail=bool(msg.get("detail")), live=bool(msg.get("live")))
            self.send({"type": ipc.STATS_REPLY, "qid": msg["qid"], "data": data})
        elif kind == ipc.CACHE_SNAPSHOT:
            data = self.core.cache_snapshot(int(msg.get("max_nodes", 256)))
            self.send({"type": ipc.STATS_REPLY, "qid": msg["qid"], "data": data})
        elif kind == ipc.SHUTDOWN:
            self.running = False
        else:
            logger.warning("ignoring unknown message type %r", kind)

    def drain(self, block_ms: int) -> None:
        """Apply every queued message; wait up to `block_ms` for the first when idle."""
        if block_ms and not self.inbox.poll(block_ms):
            return
        while True:
            try:
                data = self.inbox.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.handle(ipc.unpack(data))

    def serve(self) -> None:
        """The loop: messages in, one step, deltas out; until shutdown."""
        while self.running:
            self.drain(0 if self.core.has_work() else IDLE_POLL_MS)
            if not self.running:
                break
            if self.core.has_work():
                out = self.core.step()
                if out["rids"] or out["block_rids"] or out["items"]:
                    self.send({"type": ipc.OUTPUTS, **out})
            elif os.getppid() != self.parent:
                logger.error("the server process is gone; engine exiting")
                break

    def close(self) -> None:
        if hasattr(self.core, "close"):
            self.core.close()  # the KV-event publisher's thread and ports
        self.inbox.close(linger=0)
        self.outbox.close()
        self.ctx.term()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the engine process: build the core, report readiness, serve."""
    argv = sys.argv[1:] if argv is None else argv
    paths = ipc.IpcPaths(Path(argv[0]))
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when we stop

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s engine: %(message)s", force=True
    )
    from tokenspeed.runtime.config import build_server_args
    from tokenspeed.runtime.entrypoints.engine_core import EngineCore

    server: EngineServer | None = None
    try:
        values = json.loads(paths.args_file.read_text())
        args = build_server_args(values)
        started = time.perf_counter()
        core = EngineCore(args)
        server = EngineServer(paths, core)
        info = core.info()
        info["startup_s"] = round(time.perf_counter() - started, 3)
        server.send({"type": ipc.READY, "info": info})
        server.serve()
        return 0
    except SystemExit:
        return 0
    except Exception as e:  # report, then exit non-zero: the server prints the one message
        if os.environ.get("TOKENSPEED_DEBUG"):
            logger.error("engine failed: %s", traceback.format_exc())
        message = f"{type(e).__name__}: {e}"
        _report_fatal(paths, server, message)
        return 1
    finally:
        if server is not None:
            server.close()


def _report_fatal(paths: ipc.IpcPaths, server: EngineServer | None, message: str) -> None:
    """Tell the server why we died, over the existing socket or a fresh one."""
    try:
        if server is not None:
            server.send({"type": ipc.FATAL, "message": message})
            return
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 2000)
        sock.connect(paths.from_engine)
        sock.send(ipc.pack({"type": ipc.FATAL, "message": message}))
        sock.close()
        ctx.term()
    except zmq.ZMQError:
        pass


if __name__ == "__main__":
    sys.exit(main())
