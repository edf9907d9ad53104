"""Kernel tests: Triton kernels run on CPU tensors in Triton's interpreter.

``TRITON_INTERPRET`` is read when a ``@triton.jit`` function is defined, i.e. when a Triton
kernel module is first imported; the kernels are imported lazily, so setting it here (before
any test runs) is early enough. Where a CUDA device exists the same tests run on it instead.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def device() -> torch.device:
    """CUDA when present (compiled kernels), else CPU (interpreted kernels)."""
    interpreted = os.environ.get("TRITON_INTERPRET", "0") == "1"
    return torch.device("cuda" if torch.cuda.is_available() and not interpreted else "cpu")


@pytest.fixture(autouse=True)
def _isolated_selection_state():
    """Each test starts with no cached selections, overrides or tuning loaded from files."""
    from tokenspeed.kernels import clear_selection_cache
    from tokenspeed.kernels.overrides import clear_kernel_config
    from tokenspeed.kernels.tuned import clear_tuning

    clear_kernel_config()
    clear_tuning()
    clear_selection_cache(records=True)
    yield
    clear_kernel_config()
    clear_tuning()
    clear_selection_cache(records=True)
