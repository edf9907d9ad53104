"""Summarise where a profiled kernel's warps stall, from Nsight Compute's per-instruction CSV.

    ncu --import REPORT.ncu-rep --page source --csv --print-source sass > source.csv
    python tools/ncu_stalls.py source.csv [--top 20] [--by-opcode] [--kernel NAME]

Prints the total warp-state samples, the stall reasons by share, and the instructions that
hold the most samples with their top three reasons: which barrier or wait a kernel spends its
time on (``benchmarks/results/*_stalls.txt`` are its output). ``--by-opcode`` adds the same
per opcode with its executed count: the instruction mix, and which kind of instruction the
stalls land on. ``--kernel`` picks one kernel of a report that holds several (default: the
first).
"""

from __future__ import annotations

import argparse
import csv
import re
from collections import Counter, defaultdict
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"


def _num(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def _section(rows: list[list[str]], kernel: str | None) -> list[list[str]]:
    """One kernel's rows: a report of several kernels (a split-KV launch and its merge) has a
    section per kernel, each opened by a ``"Kernel Name"`` line; the first whose name contains
    ``kernel`` (or the first of all) is kept."""
    starts = [i for i, r in enumerate(rows) if r and r[0] == "Kernel Name"] or [0]
    for begin, end in zip(starts, [*starts[1:], len(rows)], strict=True):
        name = rows[begin][1] if len(rows[begin]) > 1 else ""
        if kernel is None or kernel in name:
            return rows[begin:end]
    names = [rows[i][1] for i in starts if len(rows[i]) > 1]
    raise SystemExit(f"no kernel matching {kernel!r} in the report (it has {names})")


def _read(
    path: Path, kernel: str | None = None
) -> tuple[dict[str, int], list[list[str]], list[str], float]:
    """The CSV's column index, instruction rows, stall-reason columns and total samples of one
    kernel (a section's first line names the kernel, the second is the header)."""
    rows = _section(list(csv.reader(path.open())), kernel)
    header, data = rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(_num(r[col[SAMPLES]]) for r in data) or 1.0
    return col, data, reasons, total


def summarise(path: Path, top: int = 20, kernel: str | None = None) -> str:
    """The report as text: stall reasons, then the instructions with the most samples."""
    col, data, reasons, total = _read(path, kernel)
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


def opcode(source: str) -> str:
    """The opcode of a SASS line, without its predicate and with only the modifiers that name
    a different operation (``HGMMA.64x16x16.F32``, ``LDS.128``, ``F2FP.F16.E4M3.UNPACK_B``)."""
    op = re.sub(r"^@!?U?P\w+\s+", "", source.strip()).split(" ")[0]
    return op if op.startswith(("HGMMA", "LDS", "STS", "F2FP")) else op.split(".")[0]


def by_opcode(path: Path, top: int = 20, kernel: str | None = None) -> str:
    """Samples, executed warp instructions and the top three stall reasons per opcode."""
    col, data, reasons, total = _read(path, kernel)
    samples: Counter[str] = Counter()
    executed: Counter[str] = Counter()
    why: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for r in data:
        op = opcode(r[col["Source"]])
        samples[op] += _num(r[col[SAMPLES]])
        executed[op] += _num(r[col["Instructions Executed"]])
        for s in reasons:
            why[op][s[6:]] += _num(r[col[s]])
    lines = ["--- by opcode (samples, executed, top reasons)"]
    for op, n in samples.most_common(top):
        reasons_text = ", ".join(
            f"{s}={100 * v / total:.1f}%" for s, v in why[op].most_common(3) if v
        )
        lines.append(
            f" {op:28s} {100 * n / total:5.1f}% ex={int(executed[op]):<10d} {reasons_text}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--by-opcode", action="store_true", help="also the table per opcode")
    parser.add_argument(
        "--kernel", default=None, help="the kernel whose section to read (a part of its name)"
    )
    args = parser.parse_args(argv)
    print(summarise(args.csv, args.top, args.kernel))
    if args.by_opcode:
        print(by_opcode(args.csv, args.top, args.kernel))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
