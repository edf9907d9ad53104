"""Random inputs for every op, shared by the reference and Triton tests (small shapes)."""

from __future__ import annotations

import torch

TOLERANCE = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=3e-3, rtol=3e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


def paged_kv(
    seq_lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    v_head_dim: int | None = None,
    seed: int = 0,
):
    """Caches with shuffled pages, block tables padded with junk page ids past each request."""
    gen = torch.Generator().manual_seed(seed)
    pages_per_req = [max(1, -(-n // page_size)) for n in seq_lens]
    max_pages = max(pages_per_req) + 1  # one junk column beyond every request
    total_pages = sum(pages_per_req) + 2
    perm = torch.randperm(total_pages, generator=gen)
    block_tables = torch.full((len(seq_lens), max_pages), 10_000, dtype=torch.int32)  # junk
    used = 0
    for b, n in enumerate(pages_per_req):
        block_tables[b, :n] = perm[used : used + n].int()
        used += n
    dv = v_head_dim or head_dim
    k_cache = torch.randn(total_pages, page_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(total_pages, page_size, num_kv_heads, dv, generator=gen).to(dtype)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    return (k_cache.to(device), v_cache.to(device), block_tables.to(device), seq.to(device))


def cos_sin_cache(max_pos: int, rot_dim: int, base: float = 10000.0) -> torch.Tensor:
    """The usual rotary table: cos half then sin half, float32."""
    inv_freq = 1.0 / base ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=-1).float()
