"""Textbook float64 MLA math (loops over requests and rows), written independently of the
package's references, and random inputs shared by the MLA tests."""

from __future__ import annotations

import math

import torch


def decode64(
    query: torch.Tensor,
    kv: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: list[int],
    scale: float,
    rank: int,
    kv_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per request: gather its tokens page by page, softmax over visible keys in float64."""
    batch, q_len, heads, _ = query.shape
    page_size = kv.shape[1]
    out = torch.zeros(batch, q_len, heads, rank, dtype=torch.float64)
    lse = torch.full((batch, q_len, heads), -math.inf, dtype=torch.float64)
    for b in range(batch):
        n = seq_lens[b]
        rows = []
        for pos in range(n):
            page = int(block_tables[b, pos // page_size])
            row = kv[page, pos % page_size].double()
            if kv_scale is not None:
                s = (
                    kv_scale.reshape(())
                    if kv_scale.numel() == 1
                    else kv_scale[page, pos % page_size]
                )
                row = row * float(s)
            rows.append(row)
        if not rows:
            continue
        keys = torch.stack(rows)  # [n, D]
        for t in range(q_len):
            visible = n - q_len + t + 1
            if visible <= 0:
                continue
            k = keys[:visible]
            scores = query[b, t].double() @ k.T * scale  # [H, visible]
            lse[b, t] = torch.logsumexp(scores, dim=-1)
            out[b, t] = torch.softmax(scores, dim=-1) @ k[:, :rank]
    return out, lse


def prefill64(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_lens: list[int],
    kv_lens: list[int],
    scale: float,
    causal: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per request and head, dense float64 attention with the end-aligned causal mask."""
    heads, heads_kv = q.shape[1], k.shape[1]
    out = torch.zeros(q.shape[0], heads, v.shape[-1], dtype=torch.float64)
    lse = torch.full((q.shape[0], heads), -math.inf, dtype=torch.float64)
    q0 = k0 = 0
    for ql, kl in zip(q_lens, kv_lens, strict=True):
        for h in range(heads):
            hk = h // (heads // heads_kv)
            qq, kk, vv = (
                q[q0 : q0 + ql, h].double(),
                k[k0 : k0 + kl, hk].double(),
                v[k0 : k0 + kl, hk].double(),
            )
            scores = qq @ kk.T * scale
            if causal:
                i = torch.arange(ql)[:, None] + (kl - ql)
                j = torch.arange(kl)[None, :]
                scores = scores.masked_fill(j > i, -math.inf)
            if kl:
                lse[q0 : q0 + ql, h] = torch.logsumexp(scores, dim=-1)
                out[q0 : q0 + ql, h] = torch.softmax(scores, dim=-1) @ vv
        q0, k0 = q0 + ql, k0 + kl
    return out, lse


def paged_latent(
    seq_lens: list[int], page_size: int, dim: int, dtype: torch.dtype, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A latent cache with shuffled pages, block tables padded with junk page ids."""
    gen = torch.Generator().manual_seed(seed)
    pages_per = [max(1, -(-n // page_size)) for n in seq_lens]
    total = sum(pages_per) + 2
    perm = torch.randperm(total, generator=gen)
    tables = torch.full((len(seq_lens), max(pages_per) + 1), 10_000, dtype=torch.int32)
    used = 0
    for b, n in enumerate(pages_per):
        tables[b, :n] = perm[used : used + n].int()
        used += n
    cache = torch.randn(total, page_size, dim, generator=gen).to(dtype)
    return cache, tables


def cu(lens: list[int]) -> torch.Tensor:
    """Cumulative sequence offsets ``[0, l0, l0+l1, ...]`` as int32."""
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)
