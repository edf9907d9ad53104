"""Compile a Triton kernel for Hopper (sm_90a) on a machine without a GPU and report its resources.

Device time is scarce and a CPU machine is not; most questions about a kernel's code
(does it spill, did Triton pick ``wgmma`` or ``mma.sync``, are the loads ``cp.async`` or
TMA, how much shared memory does it take, so how many CTAs fit on an SM) are answered by the
compiler alone. This module specialises a ``@triton.jit`` function on example arguments the
way a real launch does (pointers and multiples of 16 are marked divisible by 16, an integer
equal to 1 becomes a constant), compiles it for ``sm_90a`` with the Triton that is
installed, and reads the cubin with the ``cuobjdump`` Triton ships.

    from tools.sm90_report import compile_launches, compile_report
    print(compile_report(kernel, args, constexprs, num_warps=8, num_stages=2))
    with compile_launches() as launched:  # every launch an op's launcher makes
        fused_moe(x, w13, w2, weights, ids)  # CPU tensors of the real shapes

Use the Triton version of the GPU machine (3.6 on the lent H200) for numbers that matter:
codegen changes between releases.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

_TORCH_TO_TRITON = {
    "torch.float32": "fp32",
    "torch.float16": "fp16",
    "torch.bfloat16": "bf16",
    "torch.float8_e4m3fn": "fp8e4nv",
    "torch.float8_e5m2": "fp8e5",
    "torch.int64": "i64",
    "torch.int32": "i32",
    "torch.int16": "i16",
    "torch.int8": "i8",
    "torch.uint8": "u8",
    "torch.bool": "i1",
}


@dataclass(frozen=True)
class KernelReport:
    """What the compiler made of one specialisation (counts are static SASS instructions)."""

    registers: int
    stack_bytes: int
    shared_bytes: int
    hgmma: int  # Hopper warpgroup MMA (wgmma)
    hmma: int  # Ampere-style mma.sync
    ldgsts: int  # cp.async global -> shared
    utmaldg: int  # TMA tile loads
    ldg: int  # plain global loads
    spill_loads: int  # LDL
    spill_stores: int  # STL

    @property
    def spills(self) -> bool:
        return self.stack_bytes > 0 or self.spill_loads > 0

    def ctas_per_sm(self, num_warps: int, smem_per_sm: int = 228 * 1024) -> int:
        """CTAs that fit on one H100/H200 SM by registers, shared memory and threads."""
        by_regs = 65536 // max(1, self.registers * 32 * num_warps)
        by_smem = smem_per_sm // max(1, self.shared_bytes + 1024)
        return max(0, min(by_regs, by_smem, 2048 // (32 * num_warps), 32))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _arg_type(value: Any) -> tuple[str, bool]:
    """(Triton signature type, divisible by 16) of one runtime argument."""
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        return "*" + _TORCH_TO_TRITON[str(value.dtype)], True
    if isinstance(value, bool):
        return "i1", False
    if isinstance(value, int):
        kind = "i32" if -(2**31) <= value < 2**31 else "i64"
        return kind, value % 16 == 0
    if isinstance(value, float):
        return "fp32", False
    if type(value).__name__ == "TensorDescriptor":  # a host-built TMA descriptor
        from triton.runtime.jit import mangle_type

        return mangle_type(value), False
    raise TypeError(f"cannot specialise an argument of type {type(value).__name__}")


def _bin(tool: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", tool)


def compile_report(
    fn: Any,
    args: Sequence[Any] | Mapping[str, Any],
    constexprs: Mapping[str, Any],
    *,
    num_warps: int = 4,
    num_stages: int = 2,
    capability: int = 90,
) -> KernelReport:
    """Specialise ``fn`` on ``args`` (positional or by name) + ``constexprs`` and compile it."""
    names = list(fn.arg_names)
    runtime = [n for n in names if n not in constexprs]
    values = dict(zip(runtime, args, strict=True)) if not isinstance(args, Mapping) else dict(args)
    signature: dict[str, str] = {}
    consts: dict[str, Any] = dict(constexprs)
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for i, name in enumerate(names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        value = values[name]
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value == 1):
            signature[name] = "constexpr"  # a launch specialises None and 1 the same way
            consts[name] = value
            continue
        kind, divisible = _arg_type(value)
        signature[name] = kind
        if divisible:
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    compiled = triton.compile(
        src,
        target=GPUTarget("cuda", capability, 32),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )
    return _read_cubin(compiled)


def _read_cubin(compiled: Any) -> KernelReport:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
        path = f.name
    try:
        usage = subprocess.run(
            [_bin("cuobjdump"), "--dump-resource-usage", path], capture_output=True, text=True
        ).stdout
        sass = subprocess.run(
            [_bin("cuobjdump"), "--dump-sass", path], capture_output=True, text=True
        ).stdout
    finally:
        os.unlink(path)
    found = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    regs, stack = (int(found.group(1)), int(found.group(2))) if found else (-1, -1)
    return KernelReport(
        registers=regs,
        stack_bytes=stack,
        shared_bytes=int(compiled.metadata.shared),
        hgmma=sass.count("HGMMA"),
        hmma=sass.count("HMMA"),
        ldgsts=sass.count("LDGSTS"),
        utmaldg=sass.count("UTMALDG"),
        ldg=len(re.findall(r"\bLDG\.", sass)),
        spill_loads=len(re.findall(r"\bLDL\b", sass)),
        spill_stores=len(re.findall(r"\bSTL\b", sass)),
    )


@contextlib.contextmanager
def compile_launches(*, capability: int = 90) -> Iterator[list[tuple[str, KernelReport | str]]]:
    """Within the block, every ``kernel[grid](...)`` launch compiles for sm_90a instead of running.

    Call an op's Python launcher on CPU tensors of the real shapes and dtypes: each launch it
    makes is specialised on its real arguments and compiled; the list collects ``(kernel
    name, report)``, or ``(kernel name, error text)`` for a launch the compiler rejects (the
    way to find a Triton lowering crash at some shape without a GPU). Outputs are not
    computed, so launchers that read results back between launches are out of scope.
    """
    from triton.runtime.jit import JITFunction

    results: list[tuple[str, KernelReport | str]] = []
    original = JITFunction.__getitem__

    def launch(self: Any, grid: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> None:
            warps = kwargs.pop("num_warps", 4)
            stages = kwargs.pop("num_stages", 3)
            kwargs.pop("maxnreg", None)
            try:
                report = compile_report(self, list(args), kwargs, num_warps=warps,
                                        num_stages=stages, capability=capability)  # fmt: skip
                results.append((self.__name__, report))
            except Exception as err:  # a compiler rejection is the finding, not a failure
                results.append((self.__name__, f"{type(err).__name__}: {str(err)[-300:]}"))

        return run

    JITFunction.__getitem__ = launch
    try:
        yield results
    finally:
        JITFunction.__getitem__ = original
