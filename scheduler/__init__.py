"""TokenSpeed's control plane: the C++ scheduler and its thin Python face.

Imports nothing of the runtime, the kernels or torch: it plans, it never touches tensors.
"""

from tokenspeed.scheduler._core import rolling_hash

__all__ = ["rolling_hash"]
