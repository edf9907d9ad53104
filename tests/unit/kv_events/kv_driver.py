"""A minimal engine loop around the real scheduler: tokens are random, cache ops are acked.

Enough to make the radix tree grow, share, evict to the host tier and drop pages, so the KV
events it emits can be checked against `cache_snapshot`. Every step's events become one wire
batch (the runtime publisher's encoding), exactly what the server would publish.
"""

from __future__ import annotations

import random
import socket

import tokenspeed.scheduler as ts
from tokenspeed.runtime.entrypoints.kv_events import encode_batch


class Driver:
    """Runs a scheduler with KV events on and collects one encoded batch per step."""

    def __init__(self, page_size: int = 4, device_pages: int = 48, host_pages: int = 0) -> None:
        cfg = ts.SchedulerConfig(page_size=page_size, num_device_pages=device_pages,
                                 num_host_pages=host_pages, max_scheduled_tokens=64,
                                 max_batch_size=8, max_model_len=256,
                                 enable_kv_events=True)  # fmt: skip
        self.sched = ts.Scheduler(cfg)
        self.page_size = page_size
        self.batches: list[bytes] = []
        self._n = 0

    def submit(self, tokens: list[int], max_new: int) -> str:
        """Queue one request; returns its id."""
        rid = f"r{self._n}"
        self._n += 1
        self.sched.submit_requests([ts.RequestSpec(rid, tokens, max_new)])
        return rid

    def run(self, rng: random.Random, max_steps: int = 10_000) -> None:
        """Step until every request finished, packing each step's events into a batch."""
        for _ in range(max_steps):
            if not self.sched.has_unfinished():
                break
            plan = self.sched.next_execution_plan()
            events: list[object] = []
            for op in plan.cache_ops:
                done = ts.WriteBackDone if isinstance(op, ts.WriteBackOp) else ts.LoadBackDone
                events.append(done(op.op_id))
            fwd = plan.forward
            if fwd is not None and len(fwd.request_ids):
                n = int(fwd.sample_mask.sum())
                events.append(ts.ForwardResult(fwd.forward_id, [rng.randrange(50) for _ in
                                                                 range(n)]))  # fmt: skip
            if events:
                self.sched.advance(events)
            self.flush()
        self.sched.next_execution_plan()  # publish the last forward's pages
        self.flush()

    def flush(self) -> None:
        """Drain pending events into one batch (none if there are none)."""
        events = self.sched.drain_kv_events()
        if events:
            self.batches.append(encode_batch(events, dp_rank=0))

    def snapshot_blocks(self) -> dict[str, set[int]]:
        """Block hashes per medium according to the scheduler's own snapshot."""
        snap = self.sched.cache_snapshot(100_000)
        assert not snap["truncated"]
        out: dict[str, set[int]] = {"GPU": set(), "CPU": set()}
        for node in snap["nodes"]:
            if node["device_pages"]:
                out["GPU"].update(node["block_hashes"])
            if node["host_pages"]:
                out["CPU"].update(node["block_hashes"])
        return out


def shared_prefix_workload(driver: Driver, rng: random.Random, groups: int = 4,
                           per_group: int = 6) -> list[list[int]]:  # fmt: skip
    """Submit groups of prompts sharing a long system prefix; returns the prompts."""
    prompts = []
    for g in range(groups):
        system = [rng.randrange(50) for _ in range(20 + 4 * g)]
        for _ in range(per_group):
            prompt = system + [rng.randrange(50) for _ in range(rng.randrange(3, 20))]
            driver.submit(prompt, rng.randrange(1, 10))
            prompts.append(prompt)
    return prompts


def free_port() -> int:
    """A free loopback TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
