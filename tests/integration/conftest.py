"""Integration fixtures: one real `tokenspeed serve` per test module.

Each module's server runs on a free loopback port with the embedded tiny model and a small KV
pool; it is stopped with SIGTERM when the module ends.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from serving_helpers import Server, scheduler_built, start_server  # noqa: E402

#: the server's flags; a module sets SERVER_FLAGS to run its own (parsers, speculation, ...)
DEFAULT_FLAGS = (
    "--max-total-tokens", "4096", "--max-model-len", "1024", "--enable-log-request-stats",
)  # fmt: skip


@pytest.fixture(scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """The module's server: tiny model, small KV pool, short context, request stats logged
    (or the module's ``SERVER_FLAGS``)."""
    if not scheduler_built():
        pytest.skip("the C++ scheduler (tokenspeed.scheduler.Scheduler) is not built")
    flags = getattr(request.module, "SERVER_FLAGS", DEFAULT_FLAGS)
    srv = start_server(tmp_path_factory.mktemp("serve"), *flags)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> Any:
    """The official `openai` client, pointed at the module's server."""
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
