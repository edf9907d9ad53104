"""The batched sampler: penalties, temperature, masks, exponential-race sampling, logprobs.

Greedy rows take the argmax of the (penalised) logits; other rows take
``argmax(softmax(l / T) / E)`` with ``E ~ Exp(1)`` from the counter-based generator, which is
an exact draw from the filtered distribution. Processors that no row needs are skipped using
host-side flags, so an all-greedy batch costs one argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenspeed.runtime.sampling.processors import (
    apply_penalties,
    grammar_mask,
    min_p_mask,
    top_k_top_p_mask,
)
from tokenspeed.runtime.sampling.rng import exponential_noise
from tokenspeed.runtime.sampling.state import SamplingBatch, SamplingState


@dataclass
class SampleOutput:
    """Device results of one sampling call (moved to host together by the caller)."""

    tokens: torch.Tensor  # [S] int64
    logprobs: torch.Tensor | None = None  # [S] f32, sampled token's logprob
    top_ids: torch.Tensor | None = None  # [S, K] int64
    top_logprobs: torch.Tensor | None = None  # [S, K] f32


def sample(logits: torch.Tensor, batch: SamplingBatch, state: SamplingState | None) -> SampleOutput:
    """Choose one token per row of ``logits [S, V]`` (float32)."""
    raw = logits
    if batch.use_penalties and state is not None and state.counts is not None:
        assert state.prompt_mask is not None
        logits = apply_penalties(
            logits.clone(),
            state.counts[batch.slots],
            state.prompt_mask[batch.slots],
            batch.repetition,
            batch.presence,
            batch.frequency,
        )
    if batch.bias is not None:
        logits = logits.clone() if logits is raw else logits
        rows, ids, added = batch.bias
        logits.index_put_((rows, ids), added, accumulate=True)
    if batch.grammar_mask is not None and batch.grammar_index is not None:
        logits = logits.clone() if logits is raw else logits
        logits = grammar_mask(logits, batch.grammar_index, batch.grammar_mask)
    if batch.banned is not None:
        constrained, unbanned = batch.grammar_mask is not None, logits
        logits = logits.clone() if logits is raw or constrained else logits
        logits[batch.banned] = float("-inf")
        if constrained:
            # A grammar that allows only a stop token while min_tokens bans it: the grammar
            # wins, or the row would have nothing left to sample.
            dead = (logits == float("-inf")).all(dim=-1, keepdim=True)
            logits = torch.where(dead, unbanned, logits)
    greedy_tokens = logits.argmax(dim=-1)
    if batch.all_greedy:
        tokens = greedy_tokens
    else:
        scaled = logits / batch.temperature.unsqueeze(1)
        if batch.use_top_k_top_p:
            scaled = top_k_top_p_mask(scaled, batch.top_k, batch.top_p)
        if batch.use_min_p:
            scaled = min_p_mask(scaled, batch.min_p)
        noise = exponential_noise(batch.seeds, batch.positions, scaled.shape[-1])
        sampled = (scaled - noise.log()).argmax(dim=-1)
        tokens = torch.where(batch.greedy, greedy_tokens, sampled)
    out = SampleOutput(tokens=tokens)
    if batch.max_logprobs > 0:
        logp = raw.log_softmax(dim=-1)
        out.logprobs = logp.gather(1, tokens.unsqueeze(1)).squeeze(1)
        k = batch.max_logprobs - 1
        if k > 0:
            out.top_logprobs, out.top_ids = logp.topk(k, dim=-1)
    return out
