"""``tools/ncu_stalls.py``: stall reasons are summed over instructions and ranked, and the
instructions that hold the most samples come first with their own top reasons."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[3] / "tools" / "ncu_stalls.py"

CSV = """"Kernel Name","k"
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_barrier","stall_long_sb","stall_long_sb (Not Issued)"
"0x10","BAR.SYNC 0x1","30","1,000","30","0","0"
"0x20","@!P0 BRA 0x10","60","2,000","0","60","55"
"0x30","FMUL R1, R2, R3","10","3,000","0","5","0"
"0x40","FMUL.FTZ R4, R2, R3","4","500","0","4","0"
"""


def _load(tmp_path):
    spec = importlib.util.spec_from_file_location("ncu_stalls", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    path = tmp_path / "source.csv"
    path.write_text(CSV)
    return tool, path


def test_reasons_and_instructions_are_ranked(tmp_path):
    tool, path = _load(tmp_path)
    lines = tool.summarise(path, top=2).splitlines()
    assert lines[0] == "total samples 104"
    assert lines[1].split()[:3] == ["stall_long_sb", "69", "66.3%"]  # not-issued column left out
    assert lines[2].split()[:3] == ["stall_barrier", "30", "28.8%"]
    top = lines[lines.index("--- top instructions") + 1 :]
    assert len(top) == 2 and "BRA" in top[0] and "long_sb=60" in top[0]
    assert "ex=    2000" in top[0] and "BAR.SYNC" in top[1]


def test_opcodes_gather_their_predicated_and_modified_forms(tmp_path):
    tool, path = _load(tmp_path)
    assert tool.opcode("@!P0 BRA 0x10") == "BRA"
    assert tool.opcode("FMUL.FTZ R4, R2, R3") == "FMUL"
    assert tool.opcode("LDS.128 R28, [R28+0x6000]") == "LDS.128"
    lines = tool.by_opcode(path).splitlines()[1:]
    assert lines[0].split()[:3] == ["BRA", "57.7%", "ex=2000"]
    fmul = next(line for line in lines if line.split()[0] == "FMUL")
    assert fmul.split()[1:3] == ["13.5%", "ex=3500"]  # both FMULs, 14 of 104 samples
    assert "long_sb=8.7%" in fmul


def test_a_report_of_two_kernels_is_read_one_kernel_at_a_time(tmp_path):
    tool, path = _load(tmp_path)
    merge = """"Kernel Name","merge"
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_wait"
"0x10","FADD R1, R2, R3","7","100","7"
"""
    path.write_text(CSV.replace('"k"', '"split"') + merge)
    assert tool.summarise(path).splitlines()[0] == "total samples 104"
    lines = tool.summarise(path, kernel="merge").splitlines()
    assert lines[0] == "total samples 7" and lines[1].split()[:2] == ["stall_wait", "7"]
    with pytest.raises(SystemExit, match="no kernel matching 'absent'"):
        tool.summarise(path, kernel="absent")
