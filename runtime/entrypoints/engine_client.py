"""The main-process end of the engine: spawn it, wait until it is ready, route its outputs.

One asyncio task reads the engine's socket and puts each request's deltas on that request's
queue; it never detokenises (the request's own coroutine does, so a slow client only slows
itself). The engine runs as a child process in the same process group; `stop()` asks it to
exit, then terminates and finally kills it, so nothing outlives the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from tokenspeed.runtime.config import ServerArgs
from tokenspeed.runtime.entrypoints import ipc


class EngineStartError(RuntimeError):
    """The engine could not start; the message is what the user needs to read."""


class EngineDeadError(RuntimeError):
    """The engine process exited while the server was running."""


class EngineClient:
    """Owns the engine process and both sockets; routes per-request outputs to queues."""

    def __init__(self, args: ServerArgs) -> None:
        self.args = args
        self.paths = ipc.IpcPaths(Path(tempfile.mkdtemp(prefix="tokenspeed-ipc-")))
        self.ctx = zmq.asyncio.Context()
        self.to_engine = self.ctx.socket(zmq.PUSH)
        self.to_engine.setsockopt(zmq.LINGER, 0)
        self.to_engine.setsockopt(zmq.SNDHWM, 0)
        self.to_engine.bind(self.paths.to_engine)
        self.from_engine = self.ctx.socket(zmq.PULL)
        self.from_engine.setsockopt(zmq.LINGER, 0)
        self.from_engine.setsockopt(zmq.RCVHWM, 0)
        self.from_engine.bind(self.paths.from_engine)
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}
        self.queues: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self._stats_waiters: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._qids = itertools.count()
        self._reader: asyncio.Task[None] | None = None
        self.dead: str | None = None
        self.on_dead: Callable[[str], None] | None = None

    # ---- lifecycle ----------------------------------------------------------------------
    async def start(self, timeout_s: float = 600.0) -> dict[str, Any]:
        """Spawn the engine and wait for its readiness message (or its failure)."""
        self.paths.args_file.write_text(json.dumps(self.args.to_dict()))
        cmd = [sys.executable, "-m", "tokenspeed.runtime.entrypoints.engine_process"]
        self.proc = subprocess.Popen([*cmd, str(self.paths.root)], env=os.environ.copy())
        deadline = time.monotonic() + timeout_s
        while True:
            if await self.from_engine.poll(200):
                msg = ipc.unpack(await self.from_engine.recv())
                if msg["type"] == ipc.READY:
                    self.info = msg["info"]
                    break
                if msg["type"] == ipc.FATAL:
                    await self._reap()
                    raise EngineStartError(msg["message"])
            code = self.proc.poll()
            if code is not None:
                raise EngineStartError(f"the engine process exited with code {code} at startup")
            if time.monotonic() > deadline:
                raise EngineStartError(f"the engine was not ready after {timeout_s:.0f} s")
        self._reader = asyncio.create_task(self._read_loop(), name="engine-reader")
        return self.info

    async def _reap(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(self.proc.wait, 10)

    async def stop(self) -> None:
        """Ask the engine to exit; terminate, then kill it if it does not. Idempotent."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
            self._reader = None
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(zmq.ZMQError):
                await self.to_engine.send(ipc.pack({"type": ipc.SHUTDOWN}), zmq.NOBLOCK)
            for action in (None, self.proc.terminate, self.proc.kill):
                if action is not None:
                    action()
                try:
                    await asyncio.to_thread(self.proc.wait, 5)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self.close()

    def close(self) -> None:
        """Close sockets and remove the socket directory (also after a failed start)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.to_engine.close(linger=0)
        self.from_engine.close(linger=0)
        self.ctx.term()
        shutil.rmtree(self.paths.root, ignore_errors=True)

    # ---- requests -----------------------------------------------------------------------
    async def add_request(
        self, rid: str, prompt_ids: list[int], params: dict[str, Any], arrival: float
    ) -> asyncio.Queue[dict[str, Any]]:
        """Submit one sequence; its deltas arrive on the returned queue."""
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.queues[rid] = queue
        msg = {"type": ipc.ADD, "rid": rid, "prompt_ids": prompt_ids, "params": params}
        msg["arrival"] = arrival
        await self.to_engine.send(ipc.pack(msg))
        return queue

    async def abort(
        self, rids: list[str], reason: str = "abort", keep_queues: bool = False
    ) -> None:
        """End sequences in the engine (pages return to the pool); drop their queues.

        `reason` is `abort` (client gone) or `stop` (a stop string matched in the server).
        `keep_queues` lets the engine's final `abort` update reach a still-listening stream.
        """
        if not keep_queues:
            for rid in rids:
                self.queues.pop(rid, None)
        if rids and self.dead is None:
            msg = {"type": ipc.ABORT, "rids": rids, "reason": reason}
            await self.to_engine.send(ipc.pack(msg))

    def release(self, rid: str) -> None:
        """Forget a finished sequence's queue."""
        self.queues.pop(rid, None)

    async def stats(
        self, detail: bool = False, timeout_s: float = 5.0, live: bool = False
    ) -> dict[str, Any]:
        """A fresh snapshot of the engine's scheduler and cache counters (+ kernels if detail,
        + token counters and live request rows if live)."""
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        qid = next(self._qids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._stats_waiters[qid] = fut
        try:
            msg = {"type": ipc.STATS, "qid": qid, "detail": detail, "live": live}
            await self.to_engine.send(ipc.pack(msg))
            return await asyncio.wait_for(fut, timeout_s)
        finally:
            self._stats_waiters.pop(qid, None)

    async def query(self, kind: str, timeout_s: float = 10.0, **fields: Any) -> dict[str, Any]:
        """Ask the engine one question (an ipc message type such as `CACHE_SNAPSHOT`).

        The engine answers with a `STATS_REPLY` carrying the same `qid`, between two steps.
        """
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        qid = next(self._qids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._stats_waiters[qid] = fut
        try:
            await self.to_engine.send(ipc.pack({**fields, "type": kind, "qid": qid}))
            return await asyncio.wait_for(fut, timeout_s)
        finally:
            self._stats_waiters.pop(qid, None)

    # ---- outputs ------------------------------------------------------------------------
    async def _read_loop(self) -> None:
        """Route engine messages; watch the process so a crash fails requests, not hangs."""
        while True:
            if not await self.from_engine.poll(500):
                if self.proc is not None and self.proc.poll() is not None:
                    self._mark_dead(f"the engine process exited with code {self.proc.returncode}")
                    return
                continue
            msg = ipc.unpack(await self.from_engine.recv())
            kind = msg["type"]
            if kind == ipc.OUTPUTS:
                received = time.time()
                # one token each for most requests, as two columns (EngineCore.outputs)
                for rid, token in zip(msg["rids"], msg["tokens"], strict=True):
                    queue = self.queues.get(rid)
                    if queue is not None:
                        queue.put_nowait({"rid": rid, "ids": [token], "received": received})
                for rid, block in zip(msg["block_rids"], msg["blocks"], strict=True):
                    queue = self.queues.get(rid)  # a verified block (speculative decoding)
                    if queue is not None:
                        queue.put_nowait({"rid": rid, "ids": block, "received": received})
                for item in msg["items"]:
                    queue = self.queues.get(item["rid"])
                    if queue is not None:
                        item["received"] = received
                        queue.put_nowait(item)
            elif kind == ipc.STATS_REPLY:
                fut = self._stats_waiters.get(msg["qid"])
                if fut is not None and not fut.done():
                    fut.set_result(msg["data"])
            elif kind == ipc.REJECTED:
                queue = self.queues.get(msg["rid"])
                if queue is not None:
                    queue.put_nowait({"rid": msg["rid"], "error": msg["message"]})
            elif kind == ipc.FATAL:
                self._mark_dead(f"the engine failed: {msg['message']}")
                return

    def _mark_dead(self, reason: str) -> None:
        self.dead = reason
        for rid, queue in list(self.queues.items()):
            queue.put_nowait({"rid": rid, "error": reason, "fatal": True})
        self.queues.clear()
        for fut in self._stats_waiters.values():
            if not fut.done():
                fut.set_exception(EngineDeadError(reason))
        if self.on_dead is not None:
            self.on_dead(reason)
