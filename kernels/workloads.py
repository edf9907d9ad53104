"""Inputs for every op at a given shape: shared by numerics, tuning and the benchmarks.

A workload is ``(op, shape)`` where ``shape`` is a small dict of sizes (see ``SHAPE_KEYS``).
``make_inputs`` builds fresh, seeded tensors for it, ``call_op`` runs the public op, and
``outputs`` picks the tensors to compare (in-place ops return their targets).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from . import ops

Shape = Mapping[str, Any]

SHAPE_KEYS: dict[str, tuple[str, ...]] = {
    "norm.rms": ("tokens", "hidden"),
    "norm.fused_add_rms": ("tokens", "hidden"),
    "rotary.apply": ("tokens", "num_q_heads", "num_kv_heads", "head_dim", "rot_dim", "is_neox"),
    "activation.silu_and_mul": ("tokens", "intermediate"),
    "kv_cache.store": ("tokens", "num_kv_heads", "head_dim", "page_size"),
    "attention.decode": ("batch", "kv_len", "num_q_heads", "num_kv_heads", "head_dim", "page_size"),
    "attention.extend": (
        "batch",
        "q_len",
        "prefix_len",
        "num_q_heads",
        "num_kv_heads",
        "head_dim",
        "page_size",
    ),  # fmt: skip
    "moe.route": ("tokens", "num_experts", "top_k", "scoring", "n_group", "topk_group"),
    "moe.experts": ("tokens", "hidden", "intermediate", "num_experts", "top_k"),
}

OP_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "norm.rms": ops.rms_norm,
    "norm.fused_add_rms": ops.fused_add_rms_norm,
    "rotary.apply": ops.apply_rotary_emb,
    "activation.silu_and_mul": ops.silu_and_mul,
    "kv_cache.store": ops.store_kv,
    "attention.decode": ops.paged_decode_attention,
    "attention.extend": ops.paged_extend_attention,
    "moe.route": ops.moe_route,
    "moe.experts": ops.fused_moe,
}


@dataclass
class Inputs:
    """Positional and keyword arguments of one op call."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def nbytes(self) -> int:
        """Bytes of all tensor arguments (to size rotating input sets beyond L2)."""
        tensors = [a for a in (*self.args, *self.kwargs.values()) if isinstance(a, torch.Tensor)]
        return sum(t.numel() * t.element_size() for t in tensors)


def _paged_cache(
    seq_lens: torch.Tensor, shape: Shape, dtype: torch.dtype, device: torch.device, gen
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """K/V caches with each request's pages scattered randomly over the pool."""
    page_size = shape["page_size"]
    batch = seq_lens.numel()
    max_pages = -(-int(seq_lens.max()) // page_size) if batch else 1
    total = batch * max_pages + 1
    perm = torch.randperm(total, generator=gen)[: batch * max_pages]
    tables = perm.view(batch, max_pages).to(torch.int32)
    kv = (total, page_size, shape["num_kv_heads"], shape["head_dim"])
    k_cache = torch.randn(kv, generator=gen).to(dtype)
    v_cache = torch.randn(kv, generator=gen).to(dtype)
    return k_cache.to(device), v_cache.to(device), tables.to(device)


def make_inputs(
    op: str, shape: Shape, dtype: torch.dtype, device: torch.device | str, seed: int = 0
) -> Inputs:
    """Fresh random inputs for ``op`` at ``shape`` (same seed, same tensors)."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)

    def randn(*size: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(size, generator=gen) * scale).to(dtype).to(device)

    if op in ("norm.rms", "norm.fused_add_rms"):
        x, w = randn(shape["tokens"], shape["hidden"]), randn(shape["hidden"])
        if op == "norm.rms":
            return Inputs((x, w, 1e-6), {})
        return Inputs((x, randn(shape["tokens"], shape["hidden"]), w, 1e-6), {})
    if op == "rotary.apply":
        tokens, rot = shape["tokens"], shape["rot_dim"]
        inv_freq = 1.0 / 10000 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
        angles = torch.arange(4096, dtype=torch.float64)[:, None] * inv_freq[None, :]
        cache = torch.cat((angles.cos(), angles.sin()), -1).float().to(device)
        positions = torch.randint(0, 4096, (tokens,), generator=gen).to(device)
        q = randn(tokens, shape["num_q_heads"], shape["head_dim"])
        k = randn(tokens, shape["num_kv_heads"], shape["head_dim"])
        return Inputs((q, k, positions, cache, bool(shape["is_neox"])), {})
    if op == "activation.silu_and_mul":
        return Inputs((randn(shape["tokens"], 2 * shape["intermediate"]),), {})
    if op == "kv_cache.store":
        tokens, page_size = shape["tokens"], shape["page_size"]
        pages = -(-tokens // page_size) + 1
        kv = (pages, page_size, shape["num_kv_heads"], shape["head_dim"])
        slots = torch.randperm(pages * page_size, generator=gen)[:tokens].to(device)
        k, v = randn(tokens, *kv[2:]), randn(tokens, *kv[2:])
        k_cache = torch.zeros(kv, dtype=dtype, device=device)
        return Inputs((k, v, k_cache, torch.zeros_like(k_cache), slots), {})
    if op == "attention.decode":
        batch = shape["batch"]
        seq_lens = torch.full((batch,), shape["kv_len"], dtype=torch.int32)
        k_cache, v_cache, tables = _paged_cache(seq_lens, shape, dtype, device, gen)
        q = randn(batch, shape["num_q_heads"], shape["head_dim"])
        scale = shape["head_dim"] ** -0.5
        return Inputs((q, k_cache, v_cache, tables, seq_lens.to(device), scale), {})
    if op == "attention.extend":
        batch, q_len = shape["batch"], shape["q_len"]
        seq_lens = torch.full((batch,), q_len + shape["prefix_len"], dtype=torch.int32)
        k_cache, v_cache, tables = _paged_cache(seq_lens, shape, dtype, device, gen)
        cu = torch.arange(0, (batch + 1) * q_len, q_len, dtype=torch.int32).to(device)
        q = randn(batch * q_len, shape["num_q_heads"], shape["head_dim"])
        scale = shape["head_dim"] ** -0.5
        causal = bool(shape.get("causal", True))
        return Inputs((q, k_cache, v_cache, tables, cu, seq_lens.to(device), scale, causal), {})
    if op == "moe.route":
        experts = shape["num_experts"]
        # Router logits in float32 (routers compute them so; bf16 ties would make top-k order
        # arbitrary).
        logits = randn(shape["tokens"], experts).float()
        sigmoid = shape.get("scoring", "softmax") == "sigmoid"
        kwargs: dict[str, Any] = {
            "scoring": shape.get("scoring", "softmax"),
            "renormalize": True,
            "correction_bias": randn(experts, scale=0.1).float() if sigmoid else None,
            "n_group": shape.get("n_group"),
            "topk_group": shape.get("topk_group"),
        }
        return Inputs((logits, shape["top_k"]), kwargs)
    if op == "moe.experts":
        tokens, hidden, inter = shape["tokens"], shape["hidden"], shape["intermediate"]
        experts, top_k = shape["num_experts"], shape["top_k"]
        x = randn(tokens, hidden)
        w13 = randn(experts, 2 * inter, hidden, scale=hidden**-0.5)
        w2 = randn(experts, hidden, inter, scale=inter**-0.5)
        if shape.get("w2_contiguous") == "hidden":  # stored [E, I, H], as the runtime keeps it
            w2 = w2.transpose(1, 2).contiguous().transpose(1, 2)
        scores = torch.rand(tokens, experts, generator=gen)
        weights, ids = scores.topk(top_k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(device)
        return Inputs((x, w13, w2, weights, ids.to(torch.int32).to(device)), {})
    raise KeyError(f"unknown op {op!r}; known: {', '.join(SHAPE_KEYS)}")


def call_op(op: str, inputs: Inputs) -> Any:
    """Run the public op (the registry picks the kernel)."""
    return OP_FUNCTIONS[op](*inputs.args, **inputs.kwargs)


def outputs(op: str, inputs: Inputs, result: Any) -> tuple[torch.Tensor, ...]:
    """The tensors an op produced: its return value, or the targets it wrote in place."""
    if op == "kv_cache.store":
        return inputs.args[2], inputs.args[3]
    if isinstance(result, tuple):
        return tuple(result)
    return (result,)
