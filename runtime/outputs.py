"""What the offline API returns: vLLM-shaped request and completion outputs."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenspeed.runtime.engine.request import RequestStats


@dataclass
class CompletionOutput:
    """One generated sequence of a request."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    logprobs: list[dict[int, float]] | None = None

    @property
    def cumulative_logprob(self) -> float | None:
        if self.logprobs is None:
            return None
        return float(
            sum(entry[tok] for entry, tok in zip(self.logprobs, self.token_ids, strict=False))
        )


@dataclass
class RequestOutput:
    """A finished request: its prompt, its completion(s) and its stats."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True
    metrics: RequestStats | None = None
