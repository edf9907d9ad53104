"""``tools/ncu_stalls.py``: stall reasons are summed over instructions and ranked, and the
instructions that hold the most samples come first with their own top reasons."""

from __future__ import annotations

import importlib.util
from pathlib import Path

TOOL = Path(__file__).resolve().parents[3] / "tools" / "ncu_stalls.py"

CSV = """"Kernel Name","k"
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_barrier","stall_long_sb","stall_long_sb (Not Issued)"
"0x10","BAR.SYNC 0x1","30","1,000","30","0","0"
"0x20","@!P0 BRA 0x10","60","2,000","0","60","55"
"0x30","FMUL R1, R2, R3","10","3,000","0","5","0"
"""


def test_reasons_and_instructions_are_ranked(tmp_path):
    spec = importlib.util.spec_from_file_location("ncu_stalls", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    path = tmp_path / "source.csv"
    path.write_text(CSV)
    lines = tool.summarise(path, top=2).splitlines()
    assert lines[0] == "total samples 100"
    assert lines[1].split()[:3] == ["stall_long_sb", "65", "65.0%"]  # not-issued column left out
    assert lines[2].split()[:3] == ["stall_barrier", "30", "30.0%"]
    top = lines[lines.index("--- top instructions") + 1 :]
    assert len(top) == 2 and "BRA" in top[0] and "long_sb=60" in top[0]
    assert "ex=    2000" in top[0] and "BAR.SYNC" in top[1]
