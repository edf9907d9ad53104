"""Counter-based random numbers: noise depends only on (seed, output position, token id).

That is what makes a seeded request reproducible whatever else is in its batch: no generator
state is shared or advanced by other rows. The hash is a 32-bit integer mixer evaluated in
int64 arithmetic with multipliers below 2**31, so no intermediate overflows on any device.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_C1 = 0x7FEB352D
_C2 = 0x5BD1E995


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective avalanche mixer on values in ``[0, 2**32)`` held in int64."""
    x = x ^ (x >> 16)
    x = (x * _C1) & _M32
    x = x ^ (x >> 15)
    x = (x * _C2) & _M32
    return x ^ (x >> 16)


def row_keys(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One 32-bit key per row from its 64-bit seed and output position (int64 tensors)."""
    lo, hi = seeds & _M32, (seeds >> 32) & _M32
    key = mix32(mix32(lo) ^ hi)
    return mix32(key ^ (positions & _M32))


def unit_interval(bits: torch.Tensor) -> torch.Tensor:
    """32-bit hashes (int64) to float32 uniforms strictly inside (0, 1), 23 bits of resolution.

    23 bits, not 24: ``(k + 0.5) / 2**23`` is exact in float32 for every ``k < 2**23``, so the
    largest value is ``1 - 2**-24``. With 24 bits the top value rounded to 1.0, its exponential
    was 0, and that token won the race whatever its probability (or, masked to ``-inf``, made a
    NaN that ``argmax`` picked): about one step in a hundred at a 150k vocabulary.
    """
    return ((bits >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))


def uniform_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[rows, vocab]`` float32 uniforms strictly inside (0, 1) (see ``unit_interval``)."""
    keys = row_keys(seeds, positions).unsqueeze(1)
    cols = torch.arange(vocab_size, dtype=torch.int64, device=seeds.device).unsqueeze(0)
    return unit_interval(mix32(mix32(keys ^ cols) ^ keys))


def exponential_noise(
    seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int
) -> torch.Tensor:
    """``Exp(1)`` samples; ``argmax(p / E)`` draws from ``p`` (the exponential race)."""
    return -torch.log(uniform_noise(seeds, positions, vocab_size))
