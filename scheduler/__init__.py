"""TokenSpeed's control plane: the C++ scheduler and its thin Python face.

The scheduler plans, it never touches tensors. Each engine step::

    plan = scheduler.next_execution_plan()
    for op in plan.cache_ops:          # in order: write-backs, then load-backs
        run(op); events.append(WriteBackDone(op.op_id) or LoadBackDone(op.op_id))
    if plan.forward is not None:       # after the cache ops, on the same stream
        tokens = model(plan.forward)   # one token per sampled request (sample_mask)
        events.append(ForwardResult(plan.forward.forward_id, tokens))  # or ExtendResult per request
    events += [Finish(rid, reason) for every request the engine stops]
    scheduler.advance(events)

Imports nothing of the runtime, the kernels or torch. See docs/scheduler.md for the design.
"""

from tokenspeed.scheduler._core import (
    Abort,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ExecutionPlan,
    ExtendResult,
    Finish,
    ForwardMode,
    ForwardOp,
    ForwardResult,
    InvalidTransition,
    LoadBackDone,
    LoadBackOp,
    RequestSpec,
    RequestStats,
    Scheduler,
    SchedulerConfig,
    SchedulerStats,
    UnknownRequestError,
    WriteBackDone,
    WriteBackOp,
    rolling_hash,
)

#: Execution events accepted by ``Scheduler.advance``.
ExecutionEvent = ExtendResult | ForwardResult | Finish | Abort | WriteBackDone | LoadBackDone
#: KV-cache events returned by ``Scheduler.drain_kv_events``.
KvEvent = BlockStored | BlockRemoved | AllBlocksCleared
#: Cache operations in ``ExecutionPlan.cache_ops``.
CacheOp = WriteBackOp | LoadBackOp

__all__ = [
    "Abort",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "CacheOp",
    "ExecutionEvent",
    "ExecutionPlan",
    "ExtendResult",
    "Finish",
    "ForwardMode",
    "ForwardOp",
    "ForwardResult",
    "InvalidTransition",
    "KvEvent",
    "LoadBackDone",
    "LoadBackOp",
    "RequestSpec",
    "RequestStats",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerStats",
    "UnknownRequestError",
    "WriteBackDone",
    "WriteBackOp",
    "rolling_hash",
]
