"""Type stubs for the compiled scheduler (tokenspeed.scheduler._core)."""

from collections.abc import Sequence
from enum import Enum
from typing import Any

import numpy as np
import numpy.typing as npt

Tokens = Sequence[int] | npt.NDArray[np.integer]
I32 = npt.NDArray[np.int32]

class InvalidTransition(RuntimeError): ...
class UnknownRequestError(KeyError): ...

def rolling_hash(tokens: Tokens, page_size: int, parent: int = 0) -> list[int]: ...

class SchedulerConfig:
    page_size: int
    num_device_pages: int
    num_host_pages: int
    max_scheduled_tokens: int
    max_batch_size: int
    max_model_len: int | None
    enable_prefix_cache: bool
    enable_mixed_batch: bool
    enable_kv_events: bool
    decode_input_tokens: int
    def __init__(
        self,
        page_size: int,
        num_device_pages: int,
        num_host_pages: int = 0,
        max_scheduled_tokens: int = 8192,
        max_batch_size: int = 256,
        max_model_len: int | None = None,
        enable_prefix_cache: bool = True,
        enable_mixed_batch: bool = False,
        enable_kv_events: bool = False,
        decode_input_tokens: int = 1,
    ) -> None: ...

class RequestSpec:
    request_id: str
    tokens: list[int]
    max_new_tokens: int
    priority: int
    def __init__(
        self, request_id: str, tokens: Tokens, max_new_tokens: int, priority: int = 0
    ) -> None: ...

class ForwardMode(Enum):
    EXTEND = 0
    DECODE = 1
    MIXED = 2
    IDLE = 3

class ForwardOp:
    forward_id: int
    mode: ForwardMode
    num_decode: int
    batch_size: int
    request_ids: list[str]
    request_pool_indices: I32
    prefix_lens: I32
    extend_lens: I32
    seq_lens: I32
    input_ids: I32
    sample_mask: npt.NDArray[np.bool_]
    block_tables: I32
    block_table_is_view: bool
    def __len__(self) -> int: ...

class WriteBackOp:
    op_id: int
    device_pages: I32
    host_pages: I32
    def __init__(self, op_id: int, device_pages: list[int], host_pages: list[int]) -> None: ...

class LoadBackOp:
    op_id: int
    host_pages: I32
    device_pages: I32
    def __init__(self, op_id: int, host_pages: list[int], device_pages: list[int]) -> None: ...

class ExecutionPlan:
    forward: ForwardOp | None
    cache_ops: list[WriteBackOp | LoadBackOp]

class ExtendResult:
    request_id: str
    tokens: list[int]
    def __init__(self, request_id: str, tokens: Tokens) -> None: ...

class ForwardResult:
    forward_id: int
    tokens: list[int]
    counts: list[int]
    def __init__(self, forward_id: int, tokens: Tokens, counts: Tokens | None = None) -> None: ...

class Finish:
    request_id: str
    reason: str
    def __init__(self, request_id: str, reason: str = "stop") -> None: ...

class Abort:
    request_id: str
    def __init__(self, request_id: str) -> None: ...

class WriteBackDone:
    op_id: int
    def __init__(self, op_id: int) -> None: ...

class LoadBackDone:
    op_id: int
    def __init__(self, op_id: int) -> None: ...

class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: None
    medium: str
    def __init__(
        self,
        block_hashes: list[int],
        parent_block_hash: int | None,
        token_ids: list[int],
        block_size: int,
        medium: str = "GPU",
    ) -> None: ...
    def to_wire(self) -> tuple[Any, ...]: ...

class BlockRemoved:
    block_hashes: list[int]
    medium: str
    def __init__(self, block_hashes: list[int], medium: str = "GPU") -> None: ...
    def to_wire(self) -> tuple[Any, ...]: ...

class AllBlocksCleared:
    def __init__(self) -> None: ...
    def to_wire(self) -> tuple[Any, ...]: ...

class SchedulerStats:
    num_waiting: int
    num_prefilling: int
    num_decoding: int
    num_retracted: int
    device_pages_total: int
    device_pages_free: int
    device_pages_active: int
    device_pages_cached: int
    device_pages_evictable: int
    host_pages_total: int
    host_pages_free: int
    host_pages_active: int
    host_pages_cached: int
    host_pages_evictable: int
    prefix_cache_queried_tokens: int
    prefix_cache_hit_tokens: int
    num_preemptions: int
    num_cache_ops_in_flight: int
    def to_dict(self) -> dict[str, Any]: ...

class RequestStats:
    request_id: str
    state: str
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    host_cached_tokens: int
    computed_tokens: int
    preempt_count: int
    preempt_ms: float
    finished: bool
    finish_reason: str | None
    def to_dict(self) -> dict[str, Any]: ...

Event = ExtendResult | ForwardResult | Finish | Abort | WriteBackDone | LoadBackDone

class Scheduler:
    config: SchedulerConfig
    num_requests: int
    def __init__(self, config: SchedulerConfig) -> None: ...
    def submit_requests(self, requests: list[RequestSpec]) -> None: ...
    def next_execution_plan(self) -> ExecutionPlan: ...
    def advance(self, events: Event | Sequence[Event]) -> None: ...
    def drain_kv_events(self) -> list[BlockStored | BlockRemoved | AllBlocksCleared]: ...
    def stats(self) -> SchedulerStats: ...
    def request_stats(self, request_id: str) -> RequestStats: ...
    def cache_snapshot(self, max_nodes: int = 256) -> dict[str, Any]: ...
    def reset_prefix_cache(self) -> bool: ...
    def has_unfinished(self) -> bool: ...
    def page_owners(self) -> dict[str, Any]: ...
    def check_invariants(self) -> None: ...
