"""Per-request sampling parameters (OpenAI / vLLM meanings) with validation at submit time."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenspeed.runtime.grammar.spec import GrammarSpec


@dataclass
class SamplingParams:
    """How one request's tokens are chosen and when it stops.

    ``temperature == 0`` is greedy. ``top_k <= 0`` (vLLM's ``-1`` included) disables top-k;
    ``top_p == 1`` and ``min_p == 0`` disable theirs. Presence/frequency penalties follow
    OpenAI (subtract ``presence * [count > 0] + frequency * count`` over *generated* tokens);
    the repetition penalty follows HF/vLLM (divide positive / multiply negative logits of every
    token seen in the prompt or output). ``seed`` makes a request's samples reproducible no
    matter which other requests share its batch. ``logprobs = n`` returns the sampled token's
    logprob and the top ``n`` alternatives, from the model's raw distribution. ``logit_bias``
    (OpenAI) adds a value in [-100, 100] to chosen tokens' logits before any sampling step.
    ``grammar`` constrains the output (structured outputs); the request stops when the grammar
    is complete. With a thinking model (a server with a reasoning parser) the grammar holds
    the answer after the thinking block; ``thinking=False`` says the request turned thinking
    off (its chat-template arguments), so the grammar holds the output from its first token.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    logit_bias: dict[int, float] = field(default_factory=dict)
    grammar: GrammarSpec | None = None
    thinking: bool = True

    def __post_init__(self) -> None:
        self.grammar = GrammarSpec.coerce(self.grammar)
        # a dict, or its wire form (msgpack maps keep string keys only): [[token, bias], ...]
        pairs = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        self.logit_bias = {int(t): float(b) for t, b in pairs or ()}
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop_token_ids = [int(t) for t in (self.stop_token_ids or [])]
        if self.top_k < 0:
            self.top_k = 0
        self.validate()

    def validate(self) -> None:
        """Reject values the sampler cannot honour, with the OpenAI-style message."""
        checks = [
            (self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}"),
            (
                -2 <= self.presence_penalty <= 2,
                f"presence_penalty must be in [-2, 2], got {self.presence_penalty}",
            ),
            (
                -2 <= self.frequency_penalty <= 2,
                f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}",
            ),
            (
                self.repetition_penalty > 0,
                f"repetition_penalty must be > 0, got {self.repetition_penalty}",
            ),
            (
                self.max_tokens is None or self.max_tokens >= 1,
                f"max_tokens must be >= 1, got {self.max_tokens}",
            ),
            (self.min_tokens >= 0, f"min_tokens must be >= 0, got {self.min_tokens}"),
            (
                self.max_tokens is None or self.min_tokens <= self.max_tokens,
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
            ),
            (
                self.logprobs is None or 0 <= self.logprobs <= 20,
                f"logprobs must be in [0, 20], got {self.logprobs}",
            ),
            (
                self.seed is None or 0 <= self.seed < 2**63,
                f"seed must be in [0, 2**63), got {self.seed}",
            ),
            (
                all(t >= 0 for t in self.logit_bias),
                "logit_bias keys must be non-negative token ids",
            ),
            (
                all(-100 <= b <= 100 for b in self.logit_bias.values()),
                "logit_bias values must be in [-100, 100]",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )
