"""Addressing one ``BLOCK_N``-token tile of a request's paged K/V, shared by the attention
kernels (decode and extend) so the page-block fast path is written once."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def paged_kv_tile(
    n0, end, b, kv_head, block_table_ptr, k_cache_ptr, v_cache_ptr,
    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt,
    MASKED: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Positions, their in-range mask and the K/V row pointers of tokens ``[n0, n0+BLOCK_N)``.

    When the page size is a multiple of ``BLOCK_N`` a tile (tiles start at multiples of
    ``BLOCK_N``) sits inside one page: one block-table lookup gives a contiguous slab. Else
    each token looks up its own page. Unmasked tiles lie wholly inside ``[0, end)``, so their
    loads need no bounds check.
    """
    pos = n0 + tl.arange(0, BLOCK_N)
    tok_ok = (pos < end) | (not MASKED)
    if PAGE_SIZE % BLOCK_N == 0:
        page = tl.load(block_table_ptr + b * stride_bt + n0 // PAGE_SIZE).to(tl.int64)
        offset = (n0 % PAGE_SIZE) + tl.arange(0, BLOCK_N)
    else:
        page = tl.load(block_table_ptr + b * stride_bt + pos // PAGE_SIZE, mask=tok_ok, other=0)
        page = page.to(tl.int64)
        offset = pos % PAGE_SIZE
    k_rows = k_cache_ptr + page * stride_kp + offset * stride_ks + kv_head * stride_kh
    v_rows = v_cache_ptr + page * stride_vp + offset * stride_vs + kv_head * stride_vh
    return pos, tok_ok, k_rows, v_rows


@triton.jit
def tile_pages(n0, end, b, block_table_ptr, stride_bt,
               PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """Page ids of tile ``[n0, n0 + BLOCK_N)``: one scalar when the tile sits inside a page,
    else one per token (0 for tokens past ``end``).

    Safe for any ``n0``: the page-block index is clamped into the request, so a loop can fetch
    the next tile's page ids one iteration ahead. Carrying them across iterations keeps the
    K/V loads' addresses off a same-iteration load, which lets Triton's pipeliner give those
    loads the full stage count (a load whose address comes from another load in the same
    iteration gets half).
    """
    if PAGE_SIZE % BLOCK_N == 0:
        index = tl.minimum(n0, tl.maximum(end - 1, 0)) // PAGE_SIZE
        pages = tl.load(block_table_ptr + b * stride_bt + index)
    else:
        pos = n0 + tl.arange(0, BLOCK_N)
        pages = tl.load(block_table_ptr + b * stride_bt + pos // PAGE_SIZE, mask=pos < end,
                        other=0)  # fmt: skip
    return pages


@triton.jit
def kv_tile_rows(
    pages, n0, kv_head, k_cache_ptr, v_cache_ptr,
    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """K/V row pointers of tile ``[n0, n0 + BLOCK_N)`` from its ``tile_pages``."""
    page = pages.to(tl.int64)
    if PAGE_SIZE % BLOCK_N == 0:
        offset = (n0 % PAGE_SIZE) + tl.arange(0, BLOCK_N)
    else:
        offset = (n0 + tl.arange(0, BLOCK_N)) % PAGE_SIZE
    k_rows = k_cache_ptr + page * stride_kp + offset * stride_ks + kv_head * stride_kh
    v_rows = v_cache_ptr + page * stride_vp + offset * stride_vs + kv_head * stride_vh
    return k_rows, v_rows
