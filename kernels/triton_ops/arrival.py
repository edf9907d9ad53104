"""Last-arrival completion across the programs of one launch, and its self-resetting workspaces.

A launch whose programs each add a share into a global buffer lets the *last* program to
finish do the final step (merge, convert, reset), so no second launch is needed. Buffers are
kept per device and left zeroed by the kernels that use them, so a launch needs no memset.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def last_arrival(counter_ptr, parts):
    """True in exactly one of the ``parts`` programs that call this on one counter: the last.

    Every thread's stores are ordered before the (acquire-release, GPU-scope) ticket by the
    CTA barrier; the last program resets the counter, so it is zero again for the next call.
    """
    tl.debug_barrier()
    ticket = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    last = ticket == parts - 1
    if last:
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
    return last


_BUFFERS: dict[tuple[str, torch.device, torch.dtype], torch.Tensor] = {}
# Buffers replaced by a bigger one stay allocated: a CUDA graph captured earlier still uses them.
_RETIRED: list[torch.Tensor] = []


def zeroed_buffer(
    name: str, device: torch.device, count: int, dtype: torch.dtype = torch.int32
) -> torch.Tensor:
    """A zeroed buffer of at least ``count`` elements, kept per (name, device, dtype) and left
    zeroed again by the kernels that use it.

    Cached so that a launch needs no memset; while a CUDA graph is being captured a buffer
    cannot be created for later use (it would belong to the graph's pool), so a fresh zeroed
    one is captured instead (the graph then replays its memset). One launch at a time per
    device may use a cached buffer (the engine runs its forward on one stream).
    """
    key = (name, device, dtype)
    buf = _BUFFERS.get(key)
    if buf is not None and buf.numel() >= count:
        return buf
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    fresh = torch.zeros(max(count, 4096), dtype=dtype, device=device)
    if not capturing:
        if buf is not None:
            _RETIRED.append(buf)
        _BUFFERS[key] = fresh
    return fresh
