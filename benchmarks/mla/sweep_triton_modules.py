"""``sweep_decode.py`` with other versions of the Triton decode timed beside the working tree's.

A change to ``mla/triton_decode.py`` is best judged against the code before it in one run
(interleaved replays on the same GPU, clocks and temperature). Copy the earlier file into
the package under another name, then name it here; each module becomes a variant ``triton
<name>`` (the launcher ``mla_decode`` of that module, its default launch):

    git show ff6e13e:mla/triton_decode.py > mla/triton_decode_base.py   # here; carried as untracked
    python3 benchmarks/mla/sweep_triton_modules.py --modules triton_decode_base \\
        --heads 16,32,64,128 --fp8 token --interleave 6 \\
        --variants "triton default,triton triton_decode_base" --out FILE

Every other argument is ``sweep_decode.py``'s. The copied module imports the working tree's
``configs``, so both take the same launch defaults; delete the copy afterwards.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import Any

import sweep_decode


def with_modules(names: list[str]) -> Callable[..., list[tuple[str, Callable[..., Any]]]]:
    """``sweep_decode.variants`` plus ``triton <name>`` for each ``tokenspeed.mla.<name>``,
    placed right after the first variant (the others' reference)."""
    modules = [(n, importlib.import_module(f"tokenspeed.mla.{n}")) for n in names]
    plain = sweep_decode.variants

    def variants(heads: int, q_len: int, only: set[str] | None = None, fp8: bool = False):
        out = plain(heads, q_len, None, fp8)
        for i, (name, mod) in enumerate(modules):
            out.insert(1 + i, (f"triton {name}", lambda q, c, k, t, s, o, mod=mod: mod.mla_decode(
                q, c, t, s, sweep_decode.SCALE, out=o, kv_scale=k,
                max_seq_len=sweep_decode.KV_LEN)))  # fmt: skip
        return [v for v in out if only is None or v[0] in only]

    return variants


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, add_help=False)
    parser.add_argument("--modules", required=True, help="comma-separated tokenspeed.mla modules")
    args, rest = parser.parse_known_args(argv)
    sweep_decode.variants = with_modules([m for m in args.modules.split(",") if m])
    return sweep_decode.main(rest)


if __name__ == "__main__":
    sys.exit(main())
