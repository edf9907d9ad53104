"""Compile a CuTe DSL kernel for Hopper (sm_90a) on a machine without a GPU and report it.

Device time is scarce. CuTe DSL lowers a kernel to PTX before it needs a driver; only the JIT
step at the end does. With that step stubbed out, the PTX lands in a dump folder, and
``ptxas -v`` and ``cuobjdump`` (Triton ships one) answer most questions about the kernel: its
registers and spills, whether ptxas serialises the wgmma instructions (warnings C7511-C7520:
a wait in a branch, the accumulator read or short of registers while products are in flight;
they cost far more than any schedule tweak), how many HGMMA instructions and barriers
each path has, and the code size (a large kernel's hot loop can stall on instruction fetch). Layout questions can be settled the same way, by printing static layouts inside a
``cute.jit`` function.

    python tools/cute_sm90_report.py            # the MLA decode kernels, a few variants
    from tools.cute_sm90_report import compile_report
    print(compile_report(kernel_object, *example_args))   # any CuTe kernel
    info, sass = compile_sass(kernel_object, *example_args)  # ptxas -v and the SASS itself

Needs ``nvidia-cutlass-dsl`` (``pip install -e .[hopper]``) and a CUDA toolkit's ``ptxas``.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

# The DSL reads these when it is imported: set them before anything imports cutlass.
_DUMP = tempfile.mkdtemp(prefix="cute_sm90_")
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ["CUTE_DSL_KEEP_PTX"] = "1"
os.environ["CUTE_DSL_DUMP_DIR"] = _DUMP


class _Compiled(Exception):
    """Raised in place of the JIT step: the PTX has been written by then."""


@dataclass(frozen=True)
class CuteReport:
    """What ptxas and cuobjdump made of one compiled kernel."""

    registers: int
    spill_bytes: int
    wgmma_serialised: bool  # a ptxas C75xx warning: every wgmma waits for the previous one
    hgmma: int  # static SASS counts
    named_barriers: int
    instructions: int  # code size: a large kernel's hot loop can stall on instruction fetch
    branches: int
    warnings: tuple[str, ...]

    def __str__(self) -> str:
        flag = "  ** wgmma serialised (see warnings) **" if self.wgmma_serialised else ""
        return (f"{self.registers} registers, {self.spill_bytes} B spilled, {self.hgmma} HGMMA, "
                f"{self.named_barriers} BAR, {self.instructions} instructions, "
                f"{self.branches} BRA{flag}")  # fmt: skip


def _stub_jit() -> None:
    from cutlass.base_dsl import compiler

    def jit(self: Any, module: Any, opt_level: int = 2, shared_libs: Any = ()) -> Any:
        raise _Compiled()

    compiler.Compiler.jit = jit


def _cuobjdump() -> str | None:
    try:
        import triton

        path = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
        return path if os.path.exists(path) else shutil.which("cuobjdump")
    except ImportError:
        return shutil.which("cuobjdump")


def compile_sass(kernel: Any, *args: Any) -> tuple[str, str]:
    """Compile ``cute.compile(kernel, *args)`` for sm_90a without a GPU: ptxas's ``-v``
    report and the SASS (empty without ``cuobjdump``), for reading a hot loop here."""
    _stub_jit()
    import cutlass.cute as cute

    for old in glob.glob(os.path.join(_DUMP, "*.ptx")):
        os.remove(old)
    try:
        cute.compile(kernel, *args)
    except Exception as err:  # the stubbed JIT step, wrapped by the DSL
        if not isinstance(getattr(err, "cause", None) or err.__cause__ or err, _Compiled):
            raise
    (ptx_path,) = glob.glob(os.path.join(_DUMP, "*.ptx"))
    with tempfile.TemporaryDirectory() as out:
        ptx = os.path.join(out, "kernel.ptx")
        with open(ptx_path, "rb") as src, open(ptx, "wb") as dst:
            dst.write(src.read().replace(b"\0", b""))  # the dump ends in a NUL ptxas rejects
        cubin = os.path.join(out, "kernel.cubin")
        info = subprocess.run(["ptxas", "-arch=sm_90a", "-v", ptx, "-o", cubin],
                              capture_output=True, text=True, check=True).stderr  # fmt: skip
        sass = ""
        if (tool := _cuobjdump()) is not None:
            sass = subprocess.run([tool, "--dump-sass", cubin], capture_output=True,
                                  text=True).stdout  # fmt: skip
    return info, sass


def compile_report(kernel: Any, *args: Any) -> CuteReport:
    """Compile ``cute.compile(kernel, *args)`` for sm_90a without a GPU; report its resources."""
    info, sass = compile_sass(kernel, *args)
    registers = max((int(n) for n in re.findall(r"Used (\d+) registers", info)), default=0)
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", info))
    warnings = tuple(line.strip() for line in info.splitlines() if "(C7" in line)
    return CuteReport(
        registers=registers,
        spill_bytes=spills,
        # matched by what the warning says, not by code: C7512 (short of registers) was
        # missed when the codes were listed
        wgmma_serialised=any("mma_async instructions are serialized" in w for w in warnings),
        hgmma=len(re.findall(r"\bHGMMA\.", sass)),
        named_barriers=len(re.findall(r"\bBAR\.(?:SYNC|ARV)", sass)),
        instructions=len(re.findall(r"/\*[0-9a-f]{4,}\*/\s+\S", sass)),
        branches=len(re.findall(r"\bBRA\b", sass)),
        warnings=warnings,
    )


def _mla_decode_args(heads: int, page_size: int, *, split: bool) -> tuple[Any, ...]:
    """Example arguments of the MLA decode kernels (CPU tensors: only shapes matter)."""
    import cuda.bindings.driver as cuda
    import torch
    from cutlass import Float32, Int32

    from tokenspeed.kernels.cute_ops.common import cute_tensor as _cute_tensor

    batch = 4
    rows = batch * heads
    tensors = (
        _cute_tensor(torch.empty(rows, 576, dtype=torch.bfloat16)),
        _cute_tensor(torch.empty(64 * page_size, 576, dtype=torch.bfloat16)),
        _cute_tensor(torch.zeros(batch, 16, dtype=torch.int32), 4, all_dynamic=True),
        _cute_tensor(torch.zeros(batch, dtype=torch.int32), 4),
        _cute_tensor(torch.empty(rows, 512, dtype=torch.bfloat16)),
        _cute_tensor(torch.empty(rows), 4),
        _cute_tensor(torch.empty(rows * 2 if split else 1, 512)),
        _cute_tensor(torch.empty(rows * 2 if split else 1), 4),
    )
    scalars = (Float32(0.1), Int32(1), Int32(heads), Int32(2 if split else 1), Int32(page_size),
               Int32(batch), Int32(1), cuda.CUstream(0))  # fmt: skip
    return tensors + scalars


def _mla_decode_fp8_regs_args(heads: int, page_size: int):
    """Example arguments of the FP8 (register-widening) MLA decode: the bf16 ones (one split)
    with the query as 32-bit words, its pairs of values, the cache as bytes in token rows and
    a per-token scale tensor after it."""
    import torch

    from tokenspeed.kernels.cute_ops.common import cute_tensor as _cute_tensor

    _, _, *rest = _mla_decode_args(heads, page_size, split=False)
    query = _cute_tensor(torch.empty(4 * heads, 288, dtype=torch.int32))
    cache = _cute_tensor(torch.empty(64 * page_size, 576, dtype=torch.uint8))
    scale = _cute_tensor(torch.empty(64 * page_size), 4)
    return (query, cache, scale, *rest)


def main() -> None:
    """Report the MLA decode kernels the plan picks: KV tokens on M (16/64 rows), 64 rows on M
    (pairs of tiles), FP8 widened in registers (16/32/64 rows)."""
    from tokenspeed.mla.cute_decode import MlaDecodeSm90
    from tokenspeed.mla.cute_decode_fp8_regs import MlaDecodeFp8RegsSm90
    from tokenspeed.mla.cute_decode_fp8_regs64 import MlaDecodeFp8Regs64Sm90
    from tokenspeed.mla.cute_seesaw_pairs import MlaDecodeSeesawPairsSm90

    cases = [
        ("tokens-on-M, 16 rows, page 64", MlaDecodeSm90(16, 1, 64, 2, False, True), 16, 64, 0),
        ("tokens-on-M, 64 rows, page 16, split", MlaDecodeSm90(64, 2, 16, 2, True, False), 64,
         16, 1),
        ("rows-on-M pairs, page 64", MlaDecodeSeesawPairsSm90(64, False, True, True), 64, 64, 0),
        ("rows-on-M pairs, rope blocks early", MlaDecodeSeesawPairsSm90(64, False, True, True,
         rope_early=True), 128, 64, 0),
        ("rows-on-M pairs, 32-token tiles, page 64",
         MlaDecodeSeesawPairsSm90(32, False, True, True, tile=32, lazy_rescale=True), 64, 64, 0),
    ]  # fmt: skip
    for name, kernel, heads, page, split in cases:
        report = compile_report(kernel, *_mla_decode_args(heads, page, split=bool(split)))
        print(f"{name:<40} {report}")
    for rows, slots in ((16, 4), (32, 4)):  # the plan's register-widening FP8 kernels
        regs = MlaDecodeFp8RegsSm90(rows, 64, slots, False, True, per_token=True)
        report = compile_report(regs, *_mla_decode_fp8_regs_args(rows, 64))
        print(f"{f'FP8 cache, {rows} rows, in registers':<40} {report}")
    regs64 = MlaDecodeFp8Regs64Sm90(64, 3, False, True, per_token=True)
    report = compile_report(regs64, *_mla_decode_fp8_regs_args(64, 64))
    print(f"{'FP8 cache, 64 rows, in registers':<40} {report}")


if __name__ == "__main__":
    main()
