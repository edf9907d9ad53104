"""MLA kernel tests: Triton kernels run on CPU tensors in Triton's interpreter.

``TRITON_INTERPRET`` is read when a ``@triton.jit`` function is defined, i.e. when a Triton
module of ``tokenspeed.mla`` is first imported (lazily, on first selection), so setting it
here, before any test runs, is early enough.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))


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
