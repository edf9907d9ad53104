"""Summarise where a profiled kernel's warps stall, from Nsight Compute's per-instruction CSV.

    ncu --import REPORT.ncu-rep --page source --csv --print-source sass > source.csv
    python tools/ncu_stalls.py source.csv [--top 20]

Prints the total warp-state samples, the stall reasons by share, and the instructions that
hold the most samples with their top three reasons: which barrier or wait a kernel spends its
time on (``benchmarks/results/*_stalls.txt`` are its output).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"


def _num(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def summarise(path: Path, top: int = 20) -> str:
    """The report as text (the CSV's first line names the kernel, the second is the header)."""
    rows = list(csv.reader(path.open()))
    header, data = rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(_num(r[col[SAMPLES]]) for r in data) or 1.0
    lines = [f"total samples {int(total)}"]
    by_reason = {s: sum(_num(r[col[s]]) for r in data) for s in reasons}
    for name, value in sorted(by_reason.items(), key=lambda kv: -kv[1])[:10]:
        lines.append(f"  {name:30s} {int(value):7d} {100 * value / total:5.1f}%")
    lines.append("--- top instructions")
    for r in sorted(data, key=lambda r: -_num(r[col[SAMPLES]]))[:top]:
        mine = sorted(((s, _num(r[col[s]])) for s in reasons), key=lambda kv: -kv[1])[:3]
        why = ", ".join(f"{s[6:]}={int(v)}" for s, v in mine if v)
        n = _num(r[col[SAMPLES]])
        executed = int(_num(r[col["Instructions Executed"]]))
        lines.append(f" {int(n):6d} {100 * n / total:5.1f}% ex={executed:8d} "
                     f"{r[col['Source']][:60]:60s} {why}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args(argv)
    print(summarise(args.csv, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
