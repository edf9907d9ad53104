"""``python -m tokenspeed.kernels.numerics``: passes on the shipped kernels, fails on a bad one."""

from __future__ import annotations

from tokenspeed.kernels import Capability, Priority, register_kernel
from tokenspeed.kernels.numerics import main
from tokenspeed.kernels.reference.activation import silu_and_mul
from tokenspeed.kernels.registry import unregister_kernel


def test_numerics_passes_for_registered_kernels(capsys):
    status = main(
        ["--device", "cpu", "--trials", "1", "--ops", "norm.rms", "attention.decode", "moe.route"]
    )
    out = capsys.readouterr().out
    assert status == 0
    assert "triton_paged_decode" in out and "PASS" in out and "FAIL" not in out


def test_numerics_fails_on_a_wrong_kernel(capsys):
    def off_by_a_bit(x):
        return silu_and_mul(x) * 1.01

    register_kernel(
        "activation", "silu_and_mul", name="broken_silu", solution="test", impl=off_by_a_bit,
        capability=Capability(devices=("cpu",)), priority=Priority.PLUGIN,
    )  # fmt: skip
    try:
        status = main(
            [
                "--device",
                "cpu",
                "--trials",
                "1",
                "--dtype",
                "float32",
                "--ops",
                "activation.silu_and_mul",
            ]
        )
    finally:
        unregister_kernel("activation", "silu_and_mul", "broken_silu")
    out = capsys.readouterr().out
    assert status == 1
    assert "broken_silu" in out and "FAIL" in out
