"""Batched logit processors: penalties and top-k / top-p / min-p masks.

Each takes per-row parameter tensors, so one call serves a batch of requests with different
settings; a row whose setting is neutral is left unchanged.
"""

from __future__ import annotations

import torch


def apply_penalties(
    logits: torch.Tensor,
    output_counts: torch.Tensor,
    prompt_mask: torch.Tensor,
    repetition: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
) -> torch.Tensor:
    """Penalise seen tokens (in place on ``logits [B, V]``).

    Repetition (HF/vLLM): every token in the prompt or the output has a positive logit
    divided by ``r`` and a negative one multiplied by ``r``. Presence/frequency (OpenAI):
    ``logit -= presence * [count > 0] + frequency * count`` over generated tokens only.
    """
    seen_out = output_counts > 0
    seen = seen_out | prompt_mask
    rep = repetition.unsqueeze(1)
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen, penalised, logits)
    logits -= frequency.unsqueeze(1) * output_counts.to(logits.dtype)
    logits -= presence.unsqueeze(1) * seen_out.to(logits.dtype)
    return logits


def top_k_top_p_mask(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Return ``logits`` with tokens outside each row's top-k, then top-p, set to ``-inf``.

    ``top_k <= 0`` keeps all; top-p keeps the smallest set of most likely tokens (after top-k)
    whose probability reaches ``top_p`` — a token stays if the mass strictly above it is below
    ``top_p``, so the most likely token always stays. One sort serves both.
    """
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    k = (
        torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
        .clamp(max=vocab)
        .to(torch.int64)
    )
    ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
    threshold = sorted_logits.gather(1, (k - 1).unsqueeze(1))
    drop_sorted = sorted_logits < threshold  # ties with the k-th value stay, like a value cut
    sorted_logits = sorted_logits.masked_fill(drop_sorted, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_above = probs.cumsum(dim=-1) - probs
    drop_sorted |= (mass_above >= top_p.unsqueeze(1)) & (ranks > 0)
    drop = torch.empty_like(drop_sorted).scatter_(1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def min_p_mask(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below ``min_p`` times the row's top probability."""
    probs = logits.softmax(dim=-1)
    cutoff = probs.max(dim=-1, keepdim=True).values * min_p.unsqueeze(1)
    return logits.masked_fill(probs < cutoff, float("-inf"))


def forbidden_tokens(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """Unpack a token bitmask (``[G, W]`` int32 words, bit ``t % 32`` of word ``t // 32`` set
    when token ``t`` is allowed; xgrammar's layout) into a ``[G, vocab]`` bool mask of the
    tokens *not* allowed."""
    bits = torch.bitwise_left_shift(
        torch.ones(32, dtype=torch.int32, device=bitmask.device),
        torch.arange(32, dtype=torch.int32, device=bitmask.device),
    )
    return (bitmask.unsqueeze(-1) & bits).eq(0).flatten(1)[:, :vocab]


def grammar_mask(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """``logits`` (modified in place) with every token the grammar forbids set to ``-inf`` on
    the constrained ``rows`` (ascending; ``bitmask[i]`` belongs to ``rows[i]``)."""
    forbidden = forbidden_tokens(bitmask, logits.shape[-1])
    if len(rows) == len(logits):  # every row constrained: no gather and scatter
        return logits.masked_fill_(forbidden, float("-inf"))
    logits[rows] = logits[rows].masked_fill(forbidden, float("-inf"))
    return logits
