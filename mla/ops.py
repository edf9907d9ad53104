"""The public MLA ops: each describes its call to the kernel registry and runs the choice.

Traits come from shapes only (per-step sizes bucketed to powers of two), so dispatch never
reads tensor values and never synchronises with the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenspeed.kernels.ops._common import fmt
from tokenspeed.kernels.selection import dispatch
from tokenspeed.kernels.traits import bucket

from .configs import plan_decode

__all__ = [
    "DecodePlan",
    "mla_decode",
    "mla_decode_plan",
    "mla_kv_pack",
    "mla_kv_pack_quantize_fp8",
    "mla_prefill",
    "mla_store_kv",
]


def _decode_call(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    kv_lora_rank: int,
    max_seq_len: int | None,
):
    batch, q_len, heads, dim = query.shape
    page_size = kv_cache.shape[1]
    capacity = block_tables.shape[1] * page_size
    kv_len = min(max_seq_len, capacity) if max_seq_len else capacity
    return dispatch(
        "mla",
        "decode",
        query.device,
        {"q": fmt(query), "kv_cache": fmt(kv_cache)},
        {
            "head_dim": dim,
            "kv_lora_rank": kv_lora_rank,
            "num_heads": heads,
            "q_len": q_len,
            "page_size": page_size,
            "batch": bucket(batch),
            "kv_len": bucket(kv_len),
        },
    )


@dataclass(frozen=True)
class DecodePlan:
    """What a ``mla_decode`` call will launch: kernel, split count, fold, workspace bytes.

    Computed from shapes only; size the workspace with it before capturing a CUDA graph.
    """

    kernel: str
    num_splits: int
    fold_sq_factor: int
    block_h: int
    workspace_bytes: int


def mla_decode_plan(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    *,
    num_splits: int | None = None,
    fold_sq_factor: int | None = None,
    kv_lora_rank: int = 512,
    max_seq_len: int | None = None,
) -> DecodePlan:
    """The launch plan ``mla_decode`` would use for these arguments (no kernel runs)."""
    sel = _decode_call(query, kv_cache, block_tables, kv_lora_rank, max_seq_len)
    batch, q_len, heads, _ = query.shape
    if sel.kernel.solution == "cute":
        from .configs import cute_decode_plan

        capacity = block_tables.shape[1] * kv_cache.shape[1]
        kv_len = min(max_seq_len, capacity) if max_seq_len else capacity
        cute = cute_decode_plan(
            batch,
            q_len,
            heads,
            kv_len,
            kv_cache.shape[1],
            num_splits=num_splits,
            fp8=kv_cache.dtype == torch.float8_e4m3fn,
        )
        return DecodePlan(sel.name, cute["num_splits"], 1, cute["rows"], cute["workspace_bytes"])
    if sel.kernel.solution != "triton":
        return DecodePlan(sel.name, 1, 1, 0, 0)
    plan = plan_decode(
        batch, q_len, heads, block_tables.shape[1] * kv_cache.shape[1], kv_cache.shape[1],
        kv_lora_rank=kv_lora_rank, max_seq_len=max_seq_len, num_splits=num_splits,
        fold_sq_factor=fold_sq_factor, config=sel.config, fp8=kv_cache.element_size() == 1,
    )  # fmt: skip
    return DecodePlan(
        sel.name, plan["num_splits"], plan["fold"], plan["block_h"], plan["workspace_bytes"]
    )


def mla_decode(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    softmax_scale: float,
    *,
    out: torch.Tensor | None = None,
    return_lse: bool = False,
    kv_scale: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    num_splits: int | None = None,
    fold_sq_factor: int | None = None,
    kv_lora_rank: int = 512,
    max_seq_len: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Absorbed-MLA decode: ``query[B, q_len, H, 576]`` over the paged latent cache.

    ``kv_cache[P, S, 576]`` (or ``[P, S, 1, 576]``) holds ``[kv_c (512) | k_pe (64)]`` per
    token in bf16/fp16/fp32, or FP8 e4m3 with ``kv_scale`` (one element: per tensor;
    ``[P, S]``: per token). Scores use all 576 dims, the output is ``softmax @ kv_c``:
    ``out[B, q_len, H, 512]`` in the query's dtype (bf16 for a bf16 query over an FP8 cache).
    Query token ``i`` of request ``b`` sits at position ``seq_lens[b] - q_len + i`` and sees
    keys up to itself (causal inside the query block). ``return_lse`` adds the natural-log
    LSE ``[B, q_len, H]`` float32 (``-inf`` for a request with ``seq_lens[b] == 0``, whose
    output is zero). Split-KV count and query folding are chosen from shapes; ``workspace``
    (a byte buffer of at least ``mla_decode_plan(...).workspace_bytes``) makes the call
    allocation-free for CUDA graphs. ``max_seq_len`` is an optional host-side bound on
    ``seq_lens`` that only steers the split heuristic. ``seq_lens`` and ``block_tables``
    may be strided views (a speculative batch's per-request rows); one whose elements are
    not adjacent is copied contiguous first, an allocation.
    """
    sel = _decode_call(query, kv_cache, block_tables, kv_lora_rank, max_seq_len)
    if seq_lens.stride(0) != 1:  # the kernels index lengths by request
        seq_lens = seq_lens.contiguous()
    if block_tables.stride(1) != 1:  # and each table's pages by position
        block_tables = block_tables.contiguous()
    return sel.run(
        query,
        kv_cache,
        block_tables,
        seq_lens,
        softmax_scale,
        out=out,
        return_lse=return_lse,
        kv_scale=kv_scale,
        workspace=workspace,
        num_splits=num_splits,
        fold_sq_factor=fold_sq_factor,
        kv_lora_rank=kv_lora_rank,
        max_seq_len=max_seq_len,
    )


def prefill_prefix_trait(num_q_tokens: int, num_kv_tokens: int) -> str:
    """``"none"`` when shapes prove no request has a cached prefix, else ``"any"``.

    Every request has ``kv_len_b >= q_len_b`` and the lengths sum to ``Tq`` / ``Tk``, so
    ``Tq == Tk`` forces ``kv_len_b == q_len_b`` for all of them. No tensor value is read.
    """
    return "none" if num_q_tokens == num_kv_tokens else "any"


def mla_prefill(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_kv: torch.Tensor,
    *,
    softmax_scale: float,
    causal: bool = True,
    return_lse: bool = False,
    max_seqlen_q: int | None = None,
    max_seqlen_kv: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Ragged varlen prefill with decompressed K/V: ``query[Tq, H, 192]``, ``key[Tk, Hk, 192]``,
    ``value[Tk, Hk, 128]`` -> ``out[Tq, H, 128]`` (+ natural-log LSE ``[Tq, H]`` float32).

    Request ``b`` owns query rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` and key rows
    ``cu_seqlens_kv[b]:cu_seqlens_kv[b+1]`` (``kv_len >= q_len``: a cached prefix precedes
    the new tokens). Causal masks align the query block to the end of the KV sequence.
    ``max_seqlen_q`` (host-side) trims the launch grid; without it the grid is bounded by
    the total query tokens. ``out`` may be given (written in place and returned).
    The ``cu_seqlens`` start at 0 and end at ``Tq`` / ``Tk`` (no padding rows), so the
    shapes alone tell whether any request has a prefix (``Tq == Tk`` means none).
    """
    batch = cu_seqlens_q.shape[0] - 1
    sel = dispatch(
        "mla",
        "prefill",
        query.device,
        {"q": fmt(query), "k": fmt(key), "v": fmt(value)},
        {
            "qk_head_dim": query.shape[-1],
            "v_head_dim": value.shape[-1],
            "num_heads": query.shape[1],
            "group_size": query.shape[1] // max(1, key.shape[1]),
            "causal": bool(causal),
            "return_lse": bool(return_lse),
            "num_tokens": bucket(query.shape[0]),
            "batch": bucket(batch),
            "prefix": prefill_prefix_trait(query.shape[0], key.shape[0]),
        },
    )
    return sel.run(
        query,
        key,
        value,
        cu_seqlens_q,
        cu_seqlens_kv,
        softmax_scale=softmax_scale,
        causal=causal,
        return_lse=return_lse,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_kv=max_seqlen_kv,
        out=out,
    )


def _pack_traits(kv_c: torch.Tensor, k_pe: torch.Tensor) -> dict[str, int]:
    return {
        "kv_lora_rank": kv_c.shape[-1],
        "rope_dim": k_pe.shape[-1],
        "num_tokens": bucket(kv_c.shape[0]),
    }


def mla_kv_pack(
    kv_c: torch.Tensor, k_pe: torch.Tensor, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``cat([kv_c[T, 512], k_pe[T, 64]], -1) -> [T, 576]`` in one pass (strided inputs ok)."""
    sel = dispatch(
        "mla", "kv_pack", kv_c.device, {"x": fmt(kv_c), "out": fmt(out) if out is not None
        else fmt(kv_c)}, _pack_traits(kv_c, k_pe),
    )  # fmt: skip
    return sel.run(kv_c, k_pe, out=out)


def mla_kv_pack_quantize_fp8(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    *,
    scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    scale_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused ``cat`` + FP8 e4m3 quantize: ``(packed[T, 576] fp8, scale)``.

    With ``scale`` (a one-element float32 tensor: static per-tensor scale) values are
    ``clamp(x / scale, ±448)`` and ``scale`` is returned; without it each token gets
    ``scale = amax(|row|) / 448`` (returned as ``[T]`` float32, written to ``scale_out`` if
    given). Dequantize with ``packed.float() * scale`` (per row for per-token scales): the
    layout ``mla_decode``'s ``kv_scale`` reads.
    """
    out_fmt = fmt(out) if out is not None else "float8_e4m3fn"
    sel = dispatch(
        "mla", "kv_pack_fp8", kv_c.device, {"x": fmt(kv_c), "out": out_fmt},
        {**_pack_traits(kv_c, k_pe), "per_token": scale is None},
    )  # fmt: skip
    return sel.run(kv_c, k_pe, scale=scale, out=out, scale_out=scale_out)


def mla_store_kv(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    kv_scale: torch.Tensor | None = None,
) -> None:
    """Write ``[kv_c | k_pe]`` of every token into the paged latent cache at ``slot_mapping``.

    Slot ``s`` is page ``s // S`` offset ``s % S``; negative slots (padding) are skipped.
    An FP8 cache quantizes on the way: ``kv_scale`` with one element is the static
    per-tensor scale; ``kv_scale[P, S]`` (contiguous float32) receives each token's scale.
    """
    sel = dispatch(
        "mla", "store_kv", kv_c.device, {"x": fmt(kv_c), "kv_cache": fmt(kv_cache)},
        {**_pack_traits(kv_c, k_pe), "page_size": kv_cache.shape[1]},
    )  # fmt: skip
    sel.run(kv_c, k_pe, kv_cache, slot_mapping, kv_scale=kv_scale)
