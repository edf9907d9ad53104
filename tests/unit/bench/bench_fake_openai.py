"""An in-memory OpenAI-compatible server for httpx.MockTransport (no sockets)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx


def sse(*events: Any) -> bytes:
    """Server-sent events, each object as one ``data:`` line, then ``[DONE]``."""
    lines = [f"data: {json.dumps(e)}\n\n" for e in events] + ["data: [DONE]\n\n"]
    return "".join(lines).encode()


class FakeServer:
    """Streams ``" ansK"`` word by word for the K-th request; records every request body.

    ``fail_when(body)`` may return an HTTP status to fail a request with.
    """

    def __init__(self, usage: bool = True, delay_s: float = 0.0, fail_when: Any = None) -> None:
        self.usage, self.delay_s, self.fail_when = usage, delay_s, fail_when
        self.bodies: list[dict[str, Any]] = []
        self.in_flight = 0
        self.peak = 0

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "fake-model"}]})
        body = json.loads(request.content)
        self.bodies.append(body)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        status = self.fail_when(body) if self.fail_when else None
        if status:
            return httpx.Response(status, json={"error": {"message": "injected failure"}})
        k = len(self.bodies)
        words = [" ans", str(k), " done"]
        chat = request.url.path.endswith("/chat/completions")
        events: list[dict[str, Any]] = []
        if chat:
            events.append(
                {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
            )
        for w in words:
            choice = {"index": 0, "delta": {"content": w}} if chat else {"index": 0, "text": w}
            events.append({"choices": [choice], "usage": None})
        if self.usage:
            usage = {"prompt_tokens": 100 + k, "completion_tokens": body["max_tokens"],
                     "total_tokens": 0, "prompt_tokens_details": {"cached_tokens": 7}}  # fmt: skip
            events.append({"choices": [], "usage": usage})
        return httpx.Response(200, content=sse(*events),
                              headers={"content-type": "text/event-stream"})  # fmt: skip
