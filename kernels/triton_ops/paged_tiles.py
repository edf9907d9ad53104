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
