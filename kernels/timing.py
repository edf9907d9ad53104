"""GPU timing for tuning and benchmarks: CUDA-graph replay over rotating inputs, medians.

A kernel timed on one input set repeatedly reads it from L2 and looks faster than it is.
``rotating`` builds enough input sets to exceed twice the L2 size; ``time_gpu`` replays a
CUDA graph that calls the function once per set (no launch gaps between calls) and
reports the median time per call over many replays, falling back to CUDA events around
eager calls when the function cannot be captured (e.g. it synchronises with the host).
Each sample is queued behind a short spin kernel, so the host's launch latency is not in it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from tokenspeed.kernels.device import capture_stream

T = TypeVar("T")

__all__ = [
    "Timing", "device_roofline", "interleave_order", "l2_bytes", "profile_call", "rotating",
    "time_gpu", "time_gpu_interleaved",
]  # fmt: skip


@dataclass(frozen=True)
class Timing:
    """Per-call time statistics in microseconds."""

    median_us: float
    p10_us: float
    p90_us: float
    samples: int
    method: str  # "cuda-graph" or "cuda-events"


def l2_bytes(device: torch.device | None = None) -> int:
    """The GPU's L2 size (50 MiB assumed when torch does not report it)."""
    props = torch.cuda.get_device_properties(device or torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)


def rotating(
    make: Callable[[int], T], nbytes: Callable[[T], int], *, max_sets: int = 64
) -> list[T]:
    """Input sets ``make(0), make(1), ...`` until together they exceed twice the L2 size."""
    sets = [make(0)]
    per_set = max(1, nbytes(sets[0]))
    want = min(max_sets, max(1, -(-2 * l2_bytes() // per_set)))
    sets += [make(i) for i in range(1, want)]
    return sets


def _stats(samples: Sequence[float], method: str) -> Timing:
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return Timing(statistics.median(ordered), pick(0.1), pick(0.9), len(ordered), method)


# Replays before the samples, at least this long: a short kernel timed right after a heavy
# one (the roofline's matmul) or after the host built its inputs otherwise runs at other clocks
# (H200, 2026-12-02: the first-timed MoE case 25.7 us, the same kernel next 23.8 us, twice).
SETTLE_S = 0.025


def _settle(graph: torch.cuda.CUDAGraph) -> None:
    """Replay ``graph`` back to back for about ``SETTLE_S`` seconds (at most 1000 replays),
    then wait for it."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    once_s = max(start.elapsed_time(end) * 1e-3, 1e-6)
    for _ in range(min(1000, int(SETTLE_S / once_s))):
        graph.replay()
    torch.cuda.synchronize()


# Spin cycles queued before each sample's start event (about 50-70 us at the H200's clocks).
# Without them the start event runs on an idle GPU at once and the sample includes the time
# the host then takes to get the timed work to it (several microseconds for a graph launch:
# 2-3 % of a 150 us kernel timed one call per graph). Triton's do_bench hides it the same
# way, behind the cache flush it queues before each call.
SPIN_CYCLES = 100_000


def time_gpu(
    fn: Callable[[Any], Any],
    input_sets: Sequence[Any],
    *,
    replays: int = 30,
    warmup: int = 2,
    use_graph: bool = True,
) -> Timing:
    """Median time of one ``fn(inputs)`` call, cycling through ``input_sets``; the host's
    launch latency is kept out of every sample (``SPIN_CYCLES``)."""
    stream = capture_stream()  # one per process: a fresh one keeps a cuBLAS workspace each
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            for inputs in input_sets:
                fn(inputs)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    calls = len(input_sets)
    if use_graph:
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                for inputs in input_sets:
                    fn(inputs)
            _settle(graph)
            samples = []
            for _ in range(replays):
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                torch.cuda._sleep(SPIN_CYCLES)
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1e3 / calls)
            del graph
            return _stats(samples, "cuda-graph")
        except Exception:  # not capturable: host syncs or allocator limits; time eagerly
            torch.cuda.synchronize()
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SPIN_CYCLES)
        start.record()
        for inputs in input_sets:
            fn(inputs)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return _stats(samples, "cuda-events")


def interleave_order(replay: int, n: int) -> list[int]:
    """The order of ``n`` calls in replay ``replay``: the rows of a Williams design (the
    sequence 0, 1, n-1, 2, n-2, ... shifted by the replay, and reversed every other ``n``
    replays), so over ``2 n`` replays every call runs twice in every position and right
    after every other call twice: a clock ramp or a neighbour's cache footprint lands on no
    variant more than on another."""
    if n < 1:
        raise ValueError(f"n={n}: nothing to order")
    base = [0]
    for k in range(1, n):
        base.append((k + 1) // 2 if k % 2 else n - k // 2)
    row = [(b + replay) % n for b in base]
    return row[::-1] if (replay // n) % 2 else row


def time_gpu_interleaved(
    fns: Sequence[Callable[[], Any]], *, replays: int = 100, warmup: int = 2
) -> list[list[float]]:
    """Per-call samples (microseconds) of several calls timed in turn: each replay runs every
    call once, back to back, in ``interleave_order``. Sample ``r`` of each call is then taken
    within a millisecond of the others' (a few calls of ~0.2 ms), under the same clocks and
    temperature, so the ratio of two calls' samples replay by replay cancels what
    separately timed rounds do not: the H200 has read one kernel 3-7 % apart in two
    back-to-back timings. The GPU stays busy from the settle to the last sample (one host
    wait per replay). Each call is captured as a CUDA graph (eager if it cannot be)."""
    stream = capture_stream()  # one per process: a fresh one keeps a cuBLAS workspace each
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            for fn in fns:
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    runs: list[Callable[[], Any]] = []
    graphs: list[torch.cuda.CUDAGraph] = []  # kept alive until the samples are taken
    for fn in fns:
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                fn()
            graphs.append(graph)
            runs.append(graph.replay)
        except Exception:  # not capturable: time it eagerly
            torch.cuda.synchronize()
            runs.append(fn)
    for _ in range(max(1, int(SETTLE_S / 1e-3))):  # about SETTLE_S of all calls in turn
        for run in runs:
            run()
    samples: list[list[float]] = [[] for _ in runs]
    for r in range(replays):
        events = []
        for i in interleave_order(r, len(runs)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(SPIN_CYCLES)
            start.record()
            runs[i]()
            end.record()
            events.append((i, start, end))
        events[-1][2].synchronize()
        for i, start, end in events:
            samples[i].append(start.elapsed_time(end) * 1e3)
    del graphs
    return samples


def device_roofline(device: torch.device | None = None) -> dict[str, float]:
    """Measured bounds of this GPU: device-copy bandwidth (read + write), read-only stream
    bandwidth and bf16 matmul rate. Targets are stated against the copy; the read stream is
    recorded beside it because a kernel that only reads (decode) can pass the copy rate, by a
    margin that differs from one GPU to the next."""
    device = device or torch.device("cuda")
    nbytes = 2 * 2**30
    copy = _time_copy(nbytes, device)
    read = _time_read(nbytes, device)
    n = 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    mm = time_gpu(lambda _: torch.mm(a, b), [None], replays=20)
    return {
        "copy_gbps": 2 * nbytes / (copy.median_us * 1e-6) / 1e9,
        "read_gbps": nbytes / (read.median_us * 1e-6) / 1e9,
        "bf16_tflops": 2 * n**3 / (mm.median_us * 1e-6) / 1e12,
    }


def profile_call(fn: Callable[[], Any], warmup: int = 2) -> None:
    """Run ``fn`` ``warmup`` times unprofiled (compiles, warm state), then once between
    ``cudaProfilerStart``/``Stop``, so ``ncu --profile-from-start off`` sees only that call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def _time_read(nbytes: int, device: torch.device) -> Timing:
    """The fastest read of ``nbytes`` through a reduction we can launch (a few bytes written):
    torch's full and row-wise sums and max. A rate reads are known to reach, not a proven
    ceiling (a well-fed decode has read slightly faster)."""
    src = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=device)
    rows = src.view(-1, 8192)
    candidates = [
        time_gpu(lambda _: src.sum(dtype=torch.float32), [None], replays=20),
        time_gpu(lambda _: rows.sum(dim=1, dtype=torch.float32), [None], replays=20),
        time_gpu(lambda _: rows.amax(dim=1), [None], replays=20),
    ]
    return min(candidates, key=lambda t: t.median_us)


def _time_copy(nbytes: int, device: torch.device) -> Timing:
    """The fastest device-to-device copy of ``nbytes`` we can launch (buffers freed on return).

    A captured ``cudaMemcpyAsync`` node and an elementwise copy kernel reach different rates on
    some drivers; the physical limit is the better of the two, timed eagerly and in a graph.
    """
    src = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    candidates = [
        time_gpu(lambda _: dst.copy_(src), [None], replays=20, use_graph=False),
        time_gpu(lambda _: dst.copy_(src), [None], replays=20),
        time_gpu(lambda _: torch.mul(src, 1, out=dst), [None], replays=20),
    ]
    return min(candidates, key=lambda t: t.median_us)
