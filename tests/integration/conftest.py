"""Integration fixtures: one real `tokenspeed serve` per test module.

Each module's server runs on a free loopback port with the embedded tiny model and a small KV
pool; it is stopped with SIGTERM when the module ends.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from serving_helpers import Server, scheduler_built, start_server  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The module's server: tiny model, small KV pool, short context, request stats logged."""
    if not scheduler_built():
        pytest.skip("the C++ scheduler (tokenspeed.scheduler.Scheduler) is not built")
    tmp = tmp_path_factory.mktemp("serve")
    srv = start_server(
        tmp,
        "--max-total-tokens", "4096",
        "--max-model-len", "1024",
        "--enable-log-request-stats",
    )  # fmt: skip
    yield srv
    srv.stop()
