"""Running a serving benchmark: check the server, warm up, send the workload, time it.

Independent requests start at their arrival times; multi-turn sessions start at theirs and
send their turns one after another, each turn built from the answers so far. Both hold the
shared concurrency `Limiter` only while a request is in flight.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from tokenizers import Tokenizer

from tokenspeed_cli.bench.client import (
    Endpoint,
    RequestResult,
    make_client,
    send_request,
    served_model,
)
from tokenspeed_cli.bench.datasets import BenchRequest, Session
from tokenspeed_cli.bench.errors import BenchError
from tokenspeed_cli.bench.load import Limiter, arrival_offsets, run_at_offsets

Workload = list[BenchRequest] | list[Session]


@dataclass
class ServeTarget:
    """Where and how to send: server, endpoint, model and request-body options."""

    base_url: str
    endpoint: Endpoint
    model: str | None = None
    ignore_eos: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)
    timeout_s: float | None = None
    transport: httpx.AsyncBaseTransport | None = None  # tests replace the network


@dataclass
class LoadShape:
    """Arrival process and concurrency cap."""

    request_rate: float = float("inf")
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0


@dataclass
class RunOutcome:
    """Per-request results in workload order, the measured duration and the resolved model."""

    results: list[RequestResult]
    duration_s: float
    model: str
    peak_concurrency: int


def num_requests(workload: Workload) -> int:
    """Requests the workload sends (sessions count one per turn)."""
    return sum(w.turns if isinstance(w, Session) else 1 for w in workload)


class _Sender:
    """Binds the client, target and tokenizer so jobs only pass the request."""

    def __init__(self, client: httpx.AsyncClient, target: ServeTarget, model: str,
                 tokenizer: Tokenizer) -> None:  # fmt: skip
        self.client, self.target, self.model, self.tokenizer = client, target, model, tokenizer

    async def __call__(self, req: BenchRequest) -> RequestResult:
        t = self.target
        return await send_request(self.client, t.base_url, t.endpoint, self.model, req,
                                  self.tokenizer, t.ignore_eos, t.extra_body)  # fmt: skip


async def _warm_up(send: _Sender, warmups: list[BenchRequest], limiter: Limiter) -> None:
    async def one(req: BenchRequest) -> RequestResult:
        async with limiter:
            return await send(req)

    results = await asyncio.gather(*(one(r) for r in warmups))
    failed = [r for r in results if not r.success]
    if failed:
        raise BenchError(f"warm-up request failed: {failed[0].error}")


async def prepare(
    target: ServeTarget,
    tokenizer: Tokenizer,
    warmups: list[BenchRequest],
    max_concurrency: int | None,
) -> str:
    """Check the server, resolve the model name and send the untimed warm-up requests."""
    async with make_client(target.timeout_s, target.transport) as client:
        model = await served_model(client, target.base_url, target.model)
        if warmups:
            send = _Sender(client, target, model, tokenizer)
            await _warm_up(send, warmups, Limiter(max_concurrency))
    return model


async def run_workload(
    target: ServeTarget,
    model: str,
    workload: Workload,
    tokenizer: Tokenizer,
    shape: LoadShape,
    on_done: Callable[[RequestResult], None] | None = None,
) -> RunOutcome:
    """Send the workload under ``shape`` (after `prepare`) and time every request."""
    async with make_client(target.timeout_s, target.transport) as client:
        send = _Sender(client, target, model, tokenizer)
        limiter = Limiter(shape.max_concurrency)
        done = on_done or (lambda _r: None)

        async def request_job(req: BenchRequest) -> list[RequestResult]:
            async with limiter:
                result = await send(req)
            done(result)
            return [result]

        async def session_job(session: Session) -> list[RequestResult]:
            results: list[RequestResult] = []
            for turn in range(session.turns):
                req = session.request_for_turn(turn, tokenizer)
                async with limiter:
                    result = await send(req)
                done(result)
                results.append(result)
                if not result.success:
                    break
                session.answers.append(result.generated_text)
            for _ in range(len(results), session.turns):  # a failed turn ends the session
                skipped = RequestResult(error=f"not sent: turn {len(results) - 1} failed")
                done(skipped)
                results.append(skipped)
            return results

        offsets = arrival_offsets(len(workload), shape.request_rate, shape.burstiness, shape.seed)
        start = time.perf_counter()
        if workload and isinstance(workload[0], Session):
            nested = await run_at_offsets(workload, offsets, session_job)  # type: ignore[arg-type]
        else:
            nested = await run_at_offsets(workload, offsets, request_job)  # type: ignore[arg-type]
        duration = time.perf_counter() - start
    results = [r for group in nested for r in group]
    return RunOutcome(results, duration, model, limiter.peak)
