"""Paged GQA decode attention for CPU float32: read only the pages a request uses, copy no V.

On a CPU, decode attention at small head counts is bound by memory traffic and by the number
of tensor ops, not by FLOPs. The reference (``reference/attention.py``) gathers K and V for the
full block-table width of every request (the longest request's length, so a ragged batch reads
up to ~2x the live tokens), writes those copies, and reads them again in its matmuls. Here:

1. A per-step **plan** is built from ``block_tables`` and ``seq_lens`` alone (numpy on the host
   arrays, a few vectorised passes): each request's pages in chunks of ``C`` pages (only chunks
   that hold live tokens; ``C * page_size`` is about 64 tokens, enough for a batched matmul to
   be efficient, wasting under ``C`` pages per request), each chunk's owner, an additive mask
   for positions past ``seq_len``, and the cache row of every (request, query head, position)
   for the V pass. Every layer of a step passes the same ``block_tables`` / ``seq_lens``, so
   the plan is built once per step and reused (``_PlanCache``, keyed on their values, so a
   reused or refilled tensor is safe).
2. **QK**: one ``index_select`` of the chunks' K pages (whole 4 KB pages: a streaming copy)
   and one ``bmm`` of each chunk against its request's queries. GQA costs nothing extra: all
   ``Hq`` query heads multiply all ``Hk`` key heads of the chunk and only the matching
   (diagonal) blocks are kept, which is cheaper than a strided matmul per KV head here.
3. **softmax** over a padded ``[B, Hq, L]`` score matrix (scores only: small).
4. **PV**: ``embedding_bag(mode="sum", per_sample_weights=probs)`` sums V rows straight out of
   the cache (a fused gather + weighted sum): V is never copied. Positions past ``seq_len``
   point at the request's first row with weight 0, so V rows beyond the live tokens are
   never read.

Measured and not kept (the offline benchmark, where each step reads every live page once from
memory): computing QK in place with ``torch.sparse.sampled_addmm`` over a CSR pattern of the
live (query head, K row) pairs copies nothing but was ~10% slower than the page copy + ``bmm``
(it reads K rows one dot product at a time); PV as a V page copy + ``bmm`` was slower than
``embedding_bag``; splitting the K copy + ``bmm`` into L2-sized blocks was within noise.

Same contract as the reference (``tokenspeed.kernels.paged_decode_attention``): block-table
entries past a request's pages may hold anything; a request with ``seq_len == 0`` gets zeros.
float32 only (registered for that signature); other dtypes keep the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["DecodePlan", "build_plan", "paged_decode_attention"]

CHUNK_TOKENS = 64  # tokens per QK matmul block (rounded to whole pages)


@dataclass(frozen=True)
class DecodePlan:
    """Index tensors of one decode step, shared by every layer (see the module docstring)."""

    num_chunks_per_row: int  # Wc: chunks per request row of the padded score matrix
    chunk_tokens: int  # Sc = C * page_size
    pages: torch.Tensor  # [Nc * C] int64: K pages of every live chunk, chunk-major
    owner: torch.Tensor  # [Nc] int64: the request of each live chunk
    column: torch.Tensor  # [Nc] int64: the chunk's index within its request row
    bias: torch.Tensor  # [Nc, 1, 1, Sc] float32: 0 for live positions, -inf past seq_len
    v_rows: torch.Tensor  # [B * Hq, Wc * Sc] int32/64: V row of each (request, head, position)
    empty: torch.Tensor | None  # [B, 1, 1] bool where seq_len == 0 (None when no row is empty)


def build_plan(
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    num_pages: int,
    page_size: int,
    num_kv_heads: int,
    group: int,
) -> DecodePlan:
    """The plan of one step; depends only on the tables, lengths and cache/head shapes.

    Built with numpy on the host arrays (this is a CPU kernel; the tensors share their memory):
    a few small vectorised passes, no per-request loop.
    """
    batch, width = block_tables.shape
    chunk = max(1, CHUNK_TOKENS // page_size)
    row_chunks = -(-width // chunk)
    chunk_tokens = chunk * page_size
    length = row_chunks * chunk_tokens
    lens = seq_lens.numpy().astype(np.int64)
    # int32 indices where they fit: the [B * Hq, L] V-row table is the plan's biggest array.
    index = np.int32 if num_pages * page_size * num_kv_heads < 2**31 else np.int64
    # Pad the table to whole chunks and clamp junk entries onto real pages.
    tables = np.zeros((batch, row_chunks * chunk), index)
    tables[:, :width] = np.clip(block_tables.numpy(), 0, num_pages - 1)
    live = np.arange(row_chunks)[None, :] < -(-lens // chunk_tokens)[:, None]
    owner, column = np.nonzero(live)  # live chunks, request-major
    pages = tables.reshape(batch * row_chunks, chunk)[owner * row_chunks + column].ravel()
    pages = pages.astype(np.int64)  # index_select's index
    pos = column[:, None] * chunk_tokens + np.arange(chunk_tokens)
    bias = np.where(pos < lens[owner][:, None], np.float32(0.0), np.float32(-np.inf))
    # V rows: slot * Hk + kv head of the query head; past seq_len -> the request's first row.
    positions = np.arange(length, dtype=index)
    slots = tables[:, positions // page_size] * page_size + positions % page_size  # [B, L]
    slots = np.where(positions[None, :] < lens[:, None], slots, slots[:, :1])
    kv_head = (np.arange(num_kv_heads * group) // group).astype(index)
    v_rows = (slots[:, None, :] * num_kv_heads + kv_head[None, :, None]).reshape(-1, length)
    empty = lens == 0
    return DecodePlan(
        num_chunks_per_row=row_chunks,
        chunk_tokens=chunk_tokens,
        pages=torch.from_numpy(pages),
        owner=torch.from_numpy(owner),
        column=torch.from_numpy(column),
        bias=torch.from_numpy(bias)[:, None, None, :],
        v_rows=torch.from_numpy(v_rows),
        empty=torch.from_numpy(empty).view(batch, 1, 1) if empty.any() else None,
    )


class _PlanCache:
    """The last step's plan, reused while the same tables and lengths come back (the layers).

    Keyed on values, not identity: the inputs are compared with ``torch.equal`` (a few
    microseconds at engine sizes), so a tensor refilled in place never gets a stale plan.
    """

    def __init__(self) -> None:
        self._key: tuple[object, ...] | None = None
        self._tables: torch.Tensor | None = None
        self._lens: torch.Tensor | None = None
        self._plan: DecodePlan | None = None

    def get(
        self,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        group: int,
    ) -> DecodePlan:
        key = (
            tuple(block_tables.shape),
            block_tables.dtype,
            seq_lens.dtype,
            block_tables.device,
            num_pages,
            page_size,
            num_kv_heads,
            group,
        )
        if (
            self._plan is not None
            and key == self._key
            and torch.equal(seq_lens, self._lens)
            and torch.equal(block_tables, self._tables)
        ):
            return self._plan
        plan = build_plan(block_tables, seq_lens, num_pages, page_size, num_kv_heads, group)
        self._key, self._plan = key, plan
        self._tables, self._lens = block_tables.clone(), seq_lens.clone()
        return plan


_plans = _PlanCache()


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """``q[B, Hq, D]`` over paged ``k/v_cache[P, S, Hk, D]`` -> ``[B, Hq, Dv]`` (float32, CPU)."""
    batch, num_q_heads, head_dim = q.shape
    num_pages, page_size, num_kv_heads, _ = k_cache.shape
    group, v_dim = num_q_heads // num_kv_heads, v_cache.shape[-1]
    if batch == 0:
        return q.new_zeros(0, num_q_heads, v_dim)
    plan = _plans.get(block_tables, seq_lens, num_pages, page_size, num_kv_heads, group)
    row_chunks, chunk_tokens = plan.num_chunks_per_row, plan.chunk_tokens
    live = plan.owner.numel()
    # QK per live chunk: [Hq, D] x [D, Sc * Hk]; keep query head h's block of KV head h // G.
    keys = k_cache.index_select(0, plan.pages).view(live, chunk_tokens * num_kv_heads, head_dim)
    scores = torch.bmm(q.index_select(0, plan.owner), keys.transpose(1, 2))
    scores = scores.view(live, num_kv_heads, group, chunk_tokens, num_kv_heads)
    scores = scores.diagonal(dim1=1, dim2=4).permute(0, 3, 1, 2)  # [Nc, Hk, G, Sc] (a view)
    # scale * qk + bias (-inf past seq_len), as the reference's baddbmm: one pass that also
    # makes the strided diagonal view contiguous.
    scores = torch.add(plan.bias, scores, alpha=scale)
    padded = q.new_full((batch, num_q_heads, row_chunks, chunk_tokens), float("-inf"))
    padded[plan.owner, :, plan.column, :] = scores.view(live, num_q_heads, chunk_tokens)
    probs = torch.softmax(padded.view(batch * num_q_heads, -1), dim=-1)
    out = F.embedding_bag(
        plan.v_rows, v_cache.reshape(-1, v_dim), per_sample_weights=probs, mode="sum"
    ).view(batch, num_q_heads, v_dim)
    if plan.empty is not None:  # softmax of an all -inf row is NaN; an empty request reads 0
        out = out.masked_fill(plan.empty, 0.0)
    return out
