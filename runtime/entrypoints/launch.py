"""Starting and stopping a server: HTTP socket, engine process, uvicorn, clean shutdown.

Order matters for clear failures: the tokenizer and the HTTP port are checked before the engine
(minutes on a big model) is started; requests are accepted only once the engine reports ready.
SIGINT/SIGTERM end in-flight streams with an error event, stop uvicorn, then stop the engine
(shutdown message, then SIGTERM, then SIGKILL), so no child process outlives the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import uvicorn

from tokenspeed.runtime.config import ServerArgs
from tokenspeed.runtime.entrypoints.async_llm import AsyncLLM
from tokenspeed.runtime.entrypoints.engine_client import EngineClient, EngineStartError
from tokenspeed.runtime.entrypoints.http_server import ServerState, build_app
from tokenspeed.runtime.entrypoints.metrics import ServerMetrics

logger = logging.getLogger("tokenspeed.server")

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class ServerStartError(RuntimeError):
    """The server could not start; the message says why in one line."""


def served_model_name(args: ServerArgs) -> str:
    """The name clients pass as `model`: --served-model-name, else the model argument."""
    if args.served_model_name:
        return args.served_model_name
    if args.model:
        return args.model
    from tokenspeed.runtime.tiny_model import TINY_MODEL_NAME

    return TINY_MODEL_NAME


def load_tokenizer(args: ServerArgs) -> Any:
    """The runtime's tokenizer for the model (or --tokenizer); the server needs one for text."""
    from tokenspeed.runtime.config import ConfigError
    from tokenspeed.runtime.model_source import resolve_model_path
    from tokenspeed.runtime.tokenizer import Tokenizer, TokenizerNotFound

    try:
        path = (
            Path(args.tokenizer)
            if args.tokenizer
            else resolve_model_path(args.model, args.load_format)
        )
        return Tokenizer.from_dir(path, args.chat_template)
    except TokenizerNotFound as e:
        raise ServerStartError(f"{e}; pass a tokenizer directory with --tokenizer") from None
    except (ConfigError, OSError, ValueError) as e:
        raise ServerStartError(f"cannot load the tokenizer: {e}") from None


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind the HTTP port now, so 'address in use' fails before the engine starts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ServerStartError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


class _Uvicorn(uvicorn.Server):
    """uvicorn, with our signal handling: first signal drains, and never re-raises afterwards."""

    def __init__(self, config: uvicorn.Config, on_signal: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_signal = on_signal

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        for sig in _SIGNALS:
            loop.add_signal_handler(sig, self._signal, sig)
        try:
            yield
        finally:
            for sig in _SIGNALS:
                loop.remove_signal_handler(sig)

    def _signal(self, sig: int) -> None:
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True
        logger.info("received %s, shutting down", signal.Signals(sig).name)
        self._on_signal()


async def run_server(
    args: ServerArgs,
    on_ready: Callable[[ServerState, str], None] | None = None,
    on_status: Callable[[str], None] | None = None,
) -> int:
    """Serve until a signal (exit code 0) or an engine failure (1).

    Raises `ServerStartError` when it cannot start; `on_ready(state, url)` runs once requests
    are accepted, `on_status(message)` reports startup progress.
    """
    status = on_status or (lambda m: logger.info(m))
    tokenizer = load_tokenizer(args)
    sock = bind_socket(args.host, args.port)
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    assert main_task is not None
    engine = EngineClient(args)
    exit_code = 0
    try:
        # A signal while the engine loads cancels the start-up; cleanup is in `finally`.
        for sig in _SIGNALS:
            loop.add_signal_handler(sig, main_task.cancel)
        status("starting the engine process (loading the model, sizing the KV pool)")
        try:
            info = await engine.start()
        except EngineStartError as e:
            raise ServerStartError(f"the engine failed to start: {e}") from None
        finally:
            for sig in _SIGNALS:
                loop.remove_signal_handler(sig)
        name = served_model_name(args)
        metrics = ServerMetrics(name)
        llm = AsyncLLM(
            engine,
            tokenizer,
            metrics,
            max_model_len=int(info["max_model_len"]),
            page_size=int(info["kv_capacity"]["page_size"]),
        )
        state = ServerState(
            args=args,
            llm=llm,
            tokenizer=tokenizer,
            metrics=metrics,
            model_name=name,
            engine_info=info,
            vocab_size=int(info["vocab_size"]),
        )
        config = uvicorn.Config(
            build_app(state),
            lifespan="off",
            access_log=False,
            log_level="warning",
            timeout_graceful_shutdown=10,
        )
        server = _Uvicorn(config, on_signal=llm.shutdown_streams)

        def engine_died(reason: str) -> None:
            nonlocal exit_code
            logger.error("%s; shutting the server down", reason)
            exit_code = 1
            llm.shutdown_streams()
            server.should_exit = True

        engine.on_dead = engine_died
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        if server.started and on_ready is not None:
            host = f"[{args.host}]" if ":" in args.host else args.host
            on_ready(state, f"http://{host}:{sock.getsockname()[1]}")
        await serving
        return exit_code
    finally:
        # Signals during the engine's shutdown must not kill us before it is reaped.
        for sig in _SIGNALS:
            with contextlib.suppress(Exception):
                loop.add_signal_handler(sig, lambda: None)
        try:
            await engine.stop()
        finally:
            for sig in _SIGNALS:
                with contextlib.suppress(Exception):
                    loop.remove_signal_handler(sig)
            sock.close()
