"""`tokenspeed bench`: serving benchmarks against any OpenAI-compatible server, and offline.

`bench serve` drives a running server over HTTP with generated or ShareGPT workloads and
reports vLLM's metrics plus the prefix-cache hit rate; `bench offline` runs the engine in
this process. Register with ``app.add_typer(bench.app, name="bench")``.
"""

from tokenspeed_cli.bench.cli import app

__all__ = ["app"]
