"""Turning a scheduler forward op into the tensors one model step needs.

Everything is computed with vectorised numpy on the host from the op's arrays (the scheduler
already hands them over as numpy views), then moved to the device in one pass of small copies.
There is no Python loop over tokens or requests here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import numpy as np
import torch


class ForwardMode(enum.IntEnum):
    """What kind of step this is; mirrors the scheduler's enum by name."""

    EXTEND = 0
    DECODE = 1
    MIXED = 2
    IDLE = 3

    @classmethod
    def of(cls, mode: Any) -> ForwardMode:
        """Accept our enum, the scheduler's (pybind11 enums have ``.name``) or a string."""
        if isinstance(mode, ForwardMode):
            return mode
        try:  # called a few times per step: remember each mode object seen
            return _MODE_OF[mode]
        except (KeyError, TypeError):
            pass
        name = str(getattr(mode, "name", mode)).split(".")[-1]
        for candidate in (name.upper(), name[1:].upper() if name.startswith("k") else ""):
            if candidate in cls.__members__:
                found = cls[candidate]
                break
        else:
            found = cls(int(mode))
        try:
            _MODE_OF[mode] = found
        except TypeError:  # unhashable stand-in
            pass
        return found

    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE


_MODE_OF: dict[Any, ForwardMode] = {}


class ForwardOpLike(Protocol):
    """The fields of the scheduler's ``ForwardOp`` that the executor reads."""

    mode: Any
    request_ids: list[str]
    request_pool_indices: Any
    prefix_lens: Any
    extend_lens: Any
    seq_lens: Any
    input_ids: Any
    block_tables: Any


@dataclass
class SyntheticOp:
    """A forward op made here, not by the scheduler: profiling, speculative verify views and
    drafter steps, tests."""

    mode: ForwardMode
    request_ids: list[str]
    request_pool_indices: np.ndarray
    prefix_lens: np.ndarray
    extend_lens: np.ndarray
    seq_lens: np.ndarray
    input_ids: np.ndarray
    block_tables: np.ndarray
    sample_mask: np.ndarray
    sample_counts: np.ndarray | None = None  # see ForwardBatch.sample_counts_np
    num_decode: int = 0
    decode_q_len: int = 1  # rows per request of a decode, read as one multi-token query

    @property
    def batch_size(self) -> int:
        return len(self.extend_lens)

    @classmethod
    def prefill(cls, tokens: int, pages: int, page_size: int) -> SyntheticOp:
        del page_size
        return cls(
            mode=ForwardMode.EXTEND,
            request_ids=["profile"],
            request_pool_indices=np.zeros(1, np.int32),
            prefix_lens=np.zeros(1, np.int32),
            extend_lens=np.array([tokens], np.int32),
            seq_lens=np.array([tokens], np.int32),
            input_ids=np.zeros(tokens, np.int32),
            block_tables=np.arange(pages, dtype=np.int32).reshape(1, -1),
            sample_mask=np.ones(1, bool),
        )


def sample_mask_of(op: Any) -> np.ndarray:
    """Which requests of the op get a token sampled this step.

    Decode rows always do; an extend row does only on its last prefill chunk. The scheduler
    says so explicitly; if it does not, a row whose ``seq_len`` reaches its full prompt length
    cannot be known here, so we require the attribute.
    """
    for name in ("sample_mask", "finishing_prefill", "is_last_chunk", "sample"):
        value = getattr(op, name, None)
        if value is not None:
            return np.asarray(value, dtype=bool)
    raise AttributeError("forward op does not say which requests are sampled (sample_mask)")


@dataclass
class ForwardBatch:
    """Device tensors for one step plus the host arrays they were built from."""

    mode: ForwardMode
    batch_size: int
    num_tokens: int
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64, page_id * page_size + offset
    block_tables: torch.Tensor  # [B, max_pages] int32
    seq_lens: torch.Tensor  # [B] int32, KV length after this step
    cu_seqlens_q: torch.Tensor  # [B + 1] int32
    sample_indices: torch.Tensor  # [S] int64, token index of each sampled row
    # host mirrors (numpy), for anything that must not read device memory
    seq_lens_np: np.ndarray
    extend_lens_np: np.ndarray
    prefix_lens_np: np.ndarray
    sample_rows_np: np.ndarray  # [R] int64, which requests (batch rows) are sampled
    pool_indices_np: np.ndarray  # [B] int64
    # speculative verify: positions sampled per sampled request ([R]; None: one each), the
    # last ones of its extend, so sample_indices has their sum of entries
    sample_counts_np: np.ndarray | None = None
    attn_metadata: Any = None
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def max_seq_len(self) -> int:
        return int(self.seq_lens_np.max()) if self.batch_size else 0

    @property
    def max_extend_len(self) -> int:
        return int(self.extend_lens_np.max()) if self.batch_size else 0


def segments(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For segments of ``lengths`` laid end to end (a batch's requests' tokens or rows):
    each element's segment and its place in it, so per-request layouts need no Python loop."""
    lengths = np.asarray(lengths, dtype=np.int64)
    owner = np.repeat(np.arange(len(lengths)), lengths)
    starts = np.cumsum(lengths) - lengths
    return owner, np.arange(len(owner), dtype=np.int64) - starts[owner]


def build_positions(prefix_lens: np.ndarray, extend_lens: np.ndarray) -> np.ndarray:
    """Per-token positions ``prefix_len .. prefix_len + extend_len - 1`` for every request."""
    owner, offsets = segments(extend_lens)
    return prefix_lens.astype(np.int64)[owner] + offsets


def build_slot_mapping(
    block_tables: np.ndarray, extend_lens: np.ndarray, positions: np.ndarray, page_size: int
) -> np.ndarray:
    """KV write location of each new token: its request's page for that position, + offset."""
    rows = np.repeat(np.arange(len(extend_lens)), extend_lens)
    pages = block_tables[rows, positions // page_size].astype(np.int64)
    return pages * page_size + positions % page_size


def make_forward_batch(
    op: ForwardOpLike, page_size: int, device: torch.device, pin: bool = False
) -> ForwardBatch:
    """Build a ``ForwardBatch`` from a forward op (scheduler's or a hand-made one)."""
    mode = ForwardMode.of(op.mode)
    prefix = np.asarray(op.prefix_lens, dtype=np.int64)
    extend = np.asarray(op.extend_lens, dtype=np.int64)
    seq = np.asarray(op.seq_lens, dtype=np.int64)
    tables = np.asarray(op.block_tables, dtype=np.int32)
    if tables.ndim == 1:
        tables = tables.reshape(len(extend), -1)
    # The scheduler may hand over its full-width table (max_model_len / page_size columns);
    # only the columns this step's longest request uses matter, and kernels scan the width.
    if len(seq):
        tables = tables[:, : max(1, -(-int(seq.max()) // page_size))]
    ids = np.asarray(op.input_ids)  # the scheduler's int32 view; widened where it is copied
    positions = build_positions(prefix, extend)
    if len(ids) != len(positions):
        raise ValueError(
            f"forward op has {len(ids)} input ids but extend_lens sum to {len(positions)}"
        )
    slots = build_slot_mapping(tables, extend, positions, page_size)
    cu = np.zeros(len(extend) + 1, dtype=np.int32)
    np.cumsum(extend, out=cu[1:])
    counts = getattr(op, "sample_counts", None)
    if counts is None:
        sample_rows = np.flatnonzero(sample_mask_of(op)).astype(np.int64)
        sample_idx = cu[1:][sample_rows].astype(np.int64) - 1
    else:  # the last counts[i] positions of request i (a drafted block and its bonus)
        counts = np.asarray(counts, dtype=np.int64)
        sample_rows = np.flatnonzero(counts > 0).astype(np.int64)
        counts = counts[sample_rows]
        owner, within = segments(counts)
        sample_idx = cu[1:][sample_rows].astype(np.int64)[owner] - counts[owner] + within

    staging = _staging(device) if device.type == "cuda" and pin else None
    if staging is not None:
        staging.begin()
        to_dev = staging.upload
    else:
        to_dev = partial(_host_tensor, device=device)
    batch = ForwardBatch(
        mode=mode,
        batch_size=len(extend),
        num_tokens=len(ids),
        input_ids=to_dev(ids, np.int64),
        positions=to_dev(positions, np.int64),
        slot_mapping=to_dev(slots, np.int64),
        block_tables=to_dev(tables, np.int32),
        seq_lens=to_dev(seq, np.int32),
        cu_seqlens_q=to_dev(cu, np.int32),
        sample_indices=to_dev(sample_idx, np.int64),
        seq_lens_np=seq,
        extend_lens_np=extend,
        prefix_lens_np=prefix,
        sample_rows_np=sample_rows,
        pool_indices_np=np.asarray(op.request_pool_indices, dtype=np.int64),
        sample_counts_np=counts,
    )
    if staging is not None:
        staging.end()
    return batch


# ---- host -> device ---------------------------------------------------------------------------
# The scheduler's arrays are read-only numpy views of its own memory, by design, and
# ``torch.from_numpy`` warns on (and must never be given) read-only memory. Most arrays above
# are already fresh, writable ones (int32 -> int64 conversions, cumsum, positions); the block
# table is the exception: a narrowed column slice of the scheduler's table (a zero-copy view for
# decode steps). Whatever happens, one host copy of it is needed for contiguity.
#
# * CPU: the tensors *are* the step's tensors, so a fresh array is wrapped as is (no copy) and
#   a read-only one is copied once (``np.array``), which is also the contiguity copy.
# * CUDA with pinned memory: every array is written by ``np.copyto`` straight into a reusable
#   pinned staging buffer (the int32/int64 conversion and the narrowing happen in that same
#   pass) and copied to the device with ``non_blocking=True``. That replaces a defensive
#   ``np.array`` copy plus ``Tensor.pin_memory()`` (a second host copy into freshly allocated
#   pinned memory) per array per step. A buffer is only rewritten once the previous batch's
#   copies out of it have completed (a CUDA event, normally long done: the step synchronises
#   on its sampled tokens).


def _host_tensor(a: np.ndarray, dtype: type, device: torch.device) -> torch.Tensor:
    """``a`` as a ``dtype`` tensor on ``device``: zero-copy when it is already a fresh array."""
    if a.dtype != dtype or not (a.flags.writeable and a.flags.c_contiguous):
        a = np.array(a, dtype=dtype, order="C")  # read-only scheduler memory never reaches torch
    t = torch.from_numpy(a)
    return t if device.type == "cpu" else t.to(device)


_NP_TO_TORCH = {np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32}


class _PinnedStaging:
    """Reusable pinned host buffers (one per array kind) for one CUDA device's uploads."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.buffers: dict[tuple[torch.dtype, int], torch.Tensor] = {}
        self.event: torch.cuda.Event | None = None
        self.next_index = 0

    def begin(self) -> None:
        """Wait until the previous batch's copies out of the buffers are done."""
        if self.event is not None:
            self.event.synchronize()
        self.next_index = 0

    def end(self) -> None:
        """Mark the point on the stream after which the buffers may be rewritten."""
        if self.event is None:
            self.event = torch.cuda.Event()
        self.event.record(torch.cuda.current_stream(self.device))

    def upload(self, a: np.ndarray, np_dtype: type) -> torch.Tensor:
        """Copy ``a`` as ``np_dtype`` into its pinned buffer (one pass) and send it."""
        dtype = _NP_TO_TORCH[np.dtype(np_dtype)]
        key = (dtype, self.next_index)  # the k-th upload of a batch always gets buffer k
        self.next_index += 1
        buf = self.buffers.get(key)
        if buf is None or buf.numel() < a.size:
            size = max(a.size, 2 * (buf.numel() if buf is not None else 0), 1024)
            buf = torch.empty(size, dtype=dtype, pin_memory=True)
            self.buffers[key] = buf
        host = buf[: a.size].view(a.shape)
        np.copyto(host.numpy(), a)
        return host.to(self.device, non_blocking=True)


_STAGING: dict[torch.device, _PinnedStaging] = {}


def _staging(device: torch.device) -> _PinnedStaging:
    st = _STAGING.get(device)
    if st is None:
        st = _STAGING[device] = _PinnedStaging(device)
    return st
