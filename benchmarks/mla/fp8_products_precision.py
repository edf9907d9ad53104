"""What FP8 (e4m3) products would cost the MLA decode in precision, sized on the CPU.

The FP8 decode kernels widen the e4m3 cache to 16 bits and multiply in f16 (or bf16). FP8
wgmma would skip the widening and double the matmul rate, but it needs the query and the
probabilities ``P`` in e4m3 too. This script computes one request's absorbed attention over
a per-token e4m3 cache in float64 with each product's inputs rounded as a kernel would round
them, and reports the output's error against exact products:

    python3 benchmarks/mla/fp8_products_precision.py [--out FILE.json]

Query entries of standard deviation 0.5, 2 and 8 take the attention from flat to peaked.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path

import torch

SCALE = 1 / math.sqrt(192)
E4M3_MAX = 448.0


def _e4m3_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` through e4m3 with one scale per row (its max at 448), back in float64."""
    scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-30) / E4M3_MAX
    return (x / scale).to(torch.float8_e4m3fn).double() * scale


def _through(dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: x.to(dtype).double()


def _e4m3_p(p: torch.Tensor) -> torch.Tensor:
    """Unnormalised ``P`` (in [0, 1]) through e4m3 scaled by 448."""
    return (p * E4M3_MAX).to(torch.float8_e4m3fn).double() / E4M3_MAX


# name -> (what the query goes through, what P goes through)
ROUTES: dict[str, tuple[Callable, Callable]] = {
    "bf16 query, bf16 P": (lambda q: q, _through(torch.bfloat16)),
    "f16 query, f16 P": (_through(torch.float16), _through(torch.float16)),
    "bf16 query, e4m3 P": (lambda q: q, _e4m3_p),
    "e4m3 query, e4m3 P": (_e4m3_rows, _e4m3_p),
}


def attention_errors(tokens: int, heads: int, q_std: float, seed: int = 0) -> dict[str, float]:
    """Max abs output error of each route against exact products, and the output's max."""
    gen = torch.Generator().manual_seed(seed)
    cache = _e4m3_rows(torch.randn(tokens, 576, generator=gen, dtype=torch.float64) * 0.5)
    query = (
        (torch.randn(heads, 576, generator=gen, dtype=torch.float64) * q_std).bfloat16().double()
    )

    def attend(q_round: Callable, p_round: Callable) -> torch.Tensor:
        scores = (q_round(query) @ cache.T) * SCALE
        p = torch.exp(scores - scores.amax(-1, keepdim=True))
        return (p_round(p) @ cache[:, :512]) / p.sum(-1, keepdim=True)

    exact = attend(lambda q: q, lambda p: p)
    out = {name: float((attend(*r) - exact).abs().max()) for name, r in ROUTES.items()}
    out["max |output|"] = float(exact.abs().max())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=64)
    args = parser.parse_args(argv)
    results = []
    for q_std in (0.5, 2.0, 8.0):
        errors = attention_errors(args.tokens, args.heads, q_std)
        results.append({"tokens": args.tokens, "heads": args.heads, "q_std": q_std, **errors})
        print(f"q std {q_std}: " + ", ".join(f"{k} {v:.2e}" for k, v in errors.items()))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
