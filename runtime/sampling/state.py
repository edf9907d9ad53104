"""Per-slot sampling state, so a step gathers its rows with one vectorised index.

Rows are keyed by the scheduler's request-pool index ("slot"). Scalar parameters live in host
numpy arrays (so deciding which processors a step needs never reads the device); token
counts for penalties live on the device and are updated by scatter after each step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from tokenspeed.runtime.grammar.backend import fill_bitmasks
from tokenspeed.runtime.sampling.params import SamplingParams

if TYPE_CHECKING:
    from tokenspeed.runtime.grammar.backend import RequestGrammar


@dataclass
class SamplingBatch:
    """The sampled rows of one step, as device tensors plus host-side flags."""

    slots: torch.Tensor  # [S] int64
    temperature: torch.Tensor  # [S] f32 (1 for greedy rows, so division is safe)
    greedy: torch.Tensor  # [S] bool
    top_k: torch.Tensor  # [S] int64
    top_p: torch.Tensor  # [S] f32 (inf where disabled)
    min_p: torch.Tensor  # [S] f32
    seeds: torch.Tensor  # [S] int64
    positions: torch.Tensor  # [S] int64, output index of the token being sampled
    repetition: torch.Tensor
    presence: torch.Tensor
    frequency: torch.Tensor
    all_greedy: bool
    use_top_k_top_p: bool
    use_min_p: bool
    use_penalties: bool
    max_logprobs: int  # 0 = none requested; else top-n width
    want_logprobs: np.ndarray  # [S] bool host
    banned: tuple[torch.Tensor, torch.Tensor] | None = None  # (rows, token ids) held at -inf
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # (rows, ids, added)
    # Structured outputs: the rows with a grammar, their matchers (host) and the allowed-token
    # bitmask ([G, ceil(V / 32)] int32 on the device, bit set = allowed).
    grammar_rows: np.ndarray | None = None
    grammar_index: torch.Tensor | None = None  # the same rows, on the device
    grammars: list[RequestGrammar] | None = None
    grammar_mask: torch.Tensor | None = None


class SamplingState:
    """Sampling parameters, penalty counts and grammar matchers for every request slot."""

    def __init__(self, capacity: int, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.capacity = 0
        self.counts: torch.Tensor | None = None  # [cap, V] int32, generated-token counts
        self.prompt_mask: torch.Tensor | None = None  # [cap, V] bool
        self._grow(max(capacity, 1))

    def _grow(self, capacity: int) -> None:
        old = self.capacity

        def grow(a: np.ndarray | None, fill: object, dtype: type) -> np.ndarray:
            out = np.full(capacity, fill, dtype=dtype)
            if a is not None:
                out[:old] = a
            return out

        g = self.__dict__.get
        self.temperature = grow(g("temperature"), 1.0, np.float32)
        self.top_k = grow(g("top_k"), 0, np.int64)
        self.top_p = grow(g("top_p"), 1.0, np.float32)
        self.min_p = grow(g("min_p"), 0.0, np.float32)
        self.repetition = grow(g("repetition"), 1.0, np.float32)
        self.presence = grow(g("presence"), 0.0, np.float32)
        self.frequency = grow(g("frequency"), 0.0, np.float32)
        self.seed = grow(g("seed"), 0, np.int64)
        self.out_pos = grow(g("out_pos"), 0, np.int64)
        self.logprobs = grow(g("logprobs"), -1, np.int64)
        self.penalised = grow(g("penalised"), False, np.bool_)
        self.min_tokens = grow(g("min_tokens"), 0, np.int64)
        self.bias = grow(g("bias"), None, object)  # (token ids, biases) | None
        self.has_bias = grow(g("has_bias"), False, np.bool_)
        self.grammar = grow(g("grammar"), None, object)  # RequestGrammar | None
        self.has_grammar = grow(g("has_grammar"), False, np.bool_)
        stop_ids = np.full(
            (capacity, self.__dict__.get("stop_ids", np.zeros((0, 1))).shape[1]), -1, np.int64
        )
        if old:
            stop_ids[:old] = self.stop_ids
        self.stop_ids = stop_ids
        if self.counts is not None and self.prompt_mask is not None:
            extra = capacity - old
            v = self.vocab_size
            self.counts = torch.cat([self.counts, self.counts.new_zeros(extra, v)])
            self.prompt_mask = torch.cat([self.prompt_mask, self.prompt_mask.new_zeros(extra, v)])
        self.capacity = capacity

    def _ensure_penalty_buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.counts is None or self.prompt_mask is None:
            self.counts = torch.zeros(
                self.capacity, self.vocab_size, dtype=torch.int32, device=self.device
            )
            self.prompt_mask = torch.zeros(
                self.capacity, self.vocab_size, dtype=torch.bool, device=self.device
            )
        return self.counts, self.prompt_mask

    def install(
        self,
        slot: int,
        params: SamplingParams,
        seed: int,
        prompt_ids: list[int] | np.ndarray,
        output_ids: list[int] | np.ndarray,
        stop_ids: list[int] | None = None,
        grammar: RequestGrammar | None = None,
    ) -> None:
        """Bind a request to a slot (on admission or after a retraction moved it).

        ``stop_ids`` are the tokens that would end the request (EOS, stop token ids); they are
        banned while fewer than ``params.min_tokens`` tokens have been generated. ``grammar`` is
        the request's matcher (structured outputs), which keeps its state across slots.
        """
        if slot >= self.capacity:
            self._grow(max(slot + 1, 2 * self.capacity))
        stop_ids = list(stop_ids or []) if params.min_tokens > 0 else []
        if len(stop_ids) > self.stop_ids.shape[1]:
            wider = np.full((self.capacity, len(stop_ids)), -1, np.int64)
            wider[:, : self.stop_ids.shape[1]] = self.stop_ids
            self.stop_ids = wider
        self.stop_ids[slot] = -1
        self.stop_ids[slot, : len(stop_ids)] = stop_ids
        self.min_tokens[slot] = params.min_tokens
        self.grammar[slot] = grammar
        self.has_grammar[slot] = grammar is not None
        self.bias[slot] = None
        if params.logit_bias:
            ids = np.fromiter(params.logit_bias.keys(), np.int64, len(params.logit_bias))
            values = np.fromiter(params.logit_bias.values(), np.float32, len(params.logit_bias))
            self.bias[slot] = (ids, values)
        self.has_bias[slot] = bool(params.logit_bias)
        self.temperature[slot] = params.temperature if not params.greedy else 0.0
        self.top_k[slot] = params.top_k
        self.top_p[slot] = params.top_p
        self.min_p[slot] = params.min_p
        self.repetition[slot] = params.repetition_penalty
        self.presence[slot] = params.presence_penalty
        self.frequency[slot] = params.frequency_penalty
        self.seed[slot] = seed
        self.out_pos[slot] = len(output_ids)
        self.logprobs[slot] = -1 if params.logprobs is None else params.logprobs
        self.penalised[slot] = params.has_penalties
        if params.has_penalties:
            counts, prompt_mask = self._ensure_penalty_buffers()
            counts[slot].zero_()
            prompt_mask[slot].zero_()
            if len(output_ids):
                out = torch.as_tensor(np.asarray(output_ids, dtype=np.int64), device=self.device)
                counts[slot].index_add_(0, out, torch.ones_like(out, dtype=torch.int32))
            if len(prompt_ids):
                ids = torch.as_tensor(np.asarray(prompt_ids, dtype=np.int64), device=self.device)
                prompt_mask[slot, ids] = True

    def speculable(self, slots: np.ndarray) -> np.ndarray:
        """Which slots may take drafted tokens (speculative decoding): those whose sampling
        at an output position depends only on the logits, the seed and that position. Not
        penalties (they count the tokens before), grammars (their state moves with each
        token) or an active ``min_tokens`` ban."""
        return (
            ~self.penalised[slots]
            & ~self.has_grammar[slots]
            & (self.out_pos[slots] >= self.min_tokens[slots])
        )

    def gather(self, slots: np.ndarray, offsets: np.ndarray | None = None) -> SamplingBatch:
        """Parameters of the rows sampled this step (``slots`` is host int64). ``offsets``
        (speculative decoding) puts a row that many output positions past its slot's next
        one: the rows of a drafted block sample positions p, p + 1, ..."""
        temp = self.temperature[slots]
        greedy = temp == 0.0
        top_k = self.top_k[slots]
        top_p = self.top_p[slots]
        min_p = self.min_p[slots]
        pen = self.penalised[slots]
        logprobs = self.logprobs[slots]
        sampled = ~greedy
        use_tk_tp = bool(np.any(sampled & ((top_k > 0) | (top_p < 1.0))))

        def dev(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a)).to(self.device, non_blocking=False)

        out_pos = self.out_pos[slots] if offsets is None else self.out_pos[slots] + offsets
        banned = None
        under_min = out_pos < self.min_tokens[slots]
        if under_min.any():
            ids = np.where(under_min[:, None], self.stop_ids[slots], -1)
            rows, cols = np.nonzero(ids >= 0)
            if len(rows):
                banned = (dev(rows.astype(np.int64)), dev(ids[rows, cols]))
        bias = None
        biased = np.flatnonzero(self.has_bias[slots])
        if len(biased):
            pairs = self.bias[slots[biased]].tolist()
            bias = (
                dev(np.repeat(biased, [len(ids) for ids, _ in pairs])),
                dev(np.concatenate([ids for ids, _ in pairs])),
                dev(np.concatenate([values for _, values in pairs])),
            )
        grammar_rows = np.flatnonzero(self.has_grammar[slots])
        grammars, grammar_mask, grammar_index = None, None, None
        if len(grammar_rows):
            # On a GPU this host work overlaps the forward the caller just launched.
            grammars = self.grammar[slots[grammar_rows]].tolist()
            mask = torch.full((len(grammars), (self.vocab_size + 31) // 32), -1, dtype=torch.int32)
            fill_bitmasks(grammars, mask)
            grammar_mask, grammar_index = mask.to(self.device), dev(grammar_rows)
        return SamplingBatch(
            banned=banned,
            bias=bias,
            grammar_rows=grammar_rows if grammars else None,
            grammar_index=grammar_index,
            grammars=grammars,
            grammar_mask=grammar_mask,
            slots=dev(slots.astype(np.int64)),
            temperature=dev(np.where(greedy, 1.0, temp).astype(np.float32)),
            greedy=dev(greedy),
            top_k=dev(top_k),
            top_p=dev(np.where(top_p >= 1.0, np.inf, top_p).astype(np.float32)),
            min_p=dev(min_p),
            seeds=dev(self.seed[slots]),
            positions=dev(out_pos),
            repetition=dev(self.repetition[slots]),
            presence=dev(self.presence[slots]),
            frequency=dev(self.frequency[slots]),
            all_greedy=bool(greedy.all()),
            use_top_k_top_p=use_tk_tp,
            use_min_p=bool(np.any(sampled & (min_p > 0.0))),
            use_penalties=bool(pen.any()),
            max_logprobs=int(logprobs.max(initial=-1)) + 1,
            want_logprobs=logprobs >= 0,
        )

    def record(
        self,
        slots: np.ndarray,
        batch: SamplingBatch,
        tokens: torch.Tensor,
        advance: np.ndarray | None = None,
    ) -> None:
        """Advance output positions and penalty counts by the tokens just sampled: each of
        ``slots`` (distinct) moves by one, or by ``advance`` (a speculative step's accepted
        tokens per slot); the counts take ``tokens``, the batch's rows."""
        self.out_pos[slots] += 1 if advance is None else advance
        if batch.use_penalties and self.counts is not None:
            ones = torch.ones_like(tokens, dtype=torch.int32)
            self.counts.index_put_((batch.slots, tokens), ones, accumulate=True)

    def release_grammar(self, slot: int) -> None:
        """Forget a slot's matcher (its request finished)."""
        self.grammar[slot] = None
        self.has_grammar[slot] = False

    def advance_grammars(self, batch: SamplingBatch, tokens: np.ndarray) -> np.ndarray | None:
        """Feed each constrained row its sampled token (host ``tokens [S]``); return which
        rows' grammars are now finished (``[S]`` bool), or None when no row has one."""
        if batch.grammar_rows is None or batch.grammars is None:
            return None
        done = np.zeros(len(tokens), dtype=bool)
        for row, grammar in zip(batch.grammar_rows.tolist(), batch.grammars, strict=True):
            grammar.accept(int(tokens[row]))
            done[row] = grammar.finished
        return done
