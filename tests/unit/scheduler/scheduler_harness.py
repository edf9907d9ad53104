"""A fake executor for scheduler tests.

It simulates the KV cache itself: every device and host page is a list of slots, a forward
writes ``(position, token)`` into the slots its block table names, and reads every earlier
position back to check it holds the right token. A wrong block table, a page shared between
different prefixes, a missed load-back or a write-back into the wrong page all show up as a
wrong slot, so the harness checks the scheduler's plans end to end, not its bookkeeping.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

import tokenspeed.scheduler as ts


@dataclass
class Tracked:
    """The engine's view of one request."""

    tokens: list[int]
    prompt_len: int
    max_new: int
    finished: bool = False
    finished_by: str = ""  # "length", "engine" or "abort"
    outputs: int = 0


@dataclass
class FakeEngine:
    """Drives one scheduler like the engine loop would, with a simulated KV store."""

    sched: ts.Scheduler
    rng: random.Random
    vocab: int = 4
    use_forward_result: bool = True
    check_every_step: bool = True
    requests: dict[str, Tracked] = field(default_factory=dict)
    all_sequences: list[list[int]] = field(default_factory=list)
    device: list[list[tuple[int, int] | None]] = field(init=False)
    host: list[list[tuple[int, int] | None]] = field(init=False)
    gpu_blocks: set[int] = field(default_factory=set)
    cpu_blocks: set[int] = field(default_factory=set)
    modes: list[str] = field(default_factory=list)
    steps: int = 0

    def __post_init__(self) -> None:
        cfg = self.sched.config
        self.page_size = cfg.page_size
        self.k = cfg.decode_input_tokens
        self.max_model_len = cfg.max_model_len
        self.device = [[None] * self.page_size for _ in range(cfg.num_device_pages)]
        self.host = [[None] * self.page_size for _ in range(cfg.num_host_pages)]

    # --- requests -----------------------------------------------------------------------
    def submit(self, rid: str, tokens: list[int], max_new: int, priority: int = 0) -> None:
        self.sched.submit_requests([ts.RequestSpec(rid, tokens, max_new, priority)])
        self.requests[rid] = Tracked(list(tokens), len(tokens), max_new)
        self.all_sequences.append(self.requests[rid].tokens)

    def unfinished(self) -> list[str]:
        return [rid for rid, t in self.requests.items() if not t.finished]

    # --- one step -----------------------------------------------------------------------
    def step(self, finish_prob: float = 0.0, abort_prob: float = 0.0) -> ts.ExecutionPlan:
        plan = self.sched.next_execution_plan()
        self.steps += 1
        events: list[object] = []
        for op in plan.cache_ops:
            if isinstance(op, ts.WriteBackOp):
                for d, h in zip(op.device_pages.tolist(), op.host_pages.tolist(), strict=True):
                    self.host[h] = list(self.device[d])
                events.append(ts.WriteBackDone(op.op_id))
            else:
                for h, d in zip(op.host_pages.tolist(), op.device_pages.tolist(), strict=True):
                    self.device[d] = list(self.host[h])
                events.append(ts.LoadBackDone(op.op_id))
        fwd = plan.forward
        if fwd is not None:
            self.modes.append(fwd.mode.name)
            events.extend(self._run_forward(fwd))
        for rid in self.unfinished():
            r = self.rng.random()
            if r < abort_prob:
                events.append(ts.Abort(rid))
                self._end(rid, "abort")
            elif r < abort_prob + finish_prob and self.requests[rid].outputs > 0:
                events.append(ts.Finish(rid, "stop"))
                self._end(rid, "engine")
        self.sched.advance(events)
        self._check_scheduler_finishes()
        if self.check_every_step:
            self.check_invariants()
        return plan

    def run_until_done(self, max_steps: int = 20_000, **kw: float) -> None:
        while self.sched.has_unfinished():
            assert self.steps < max_steps, "workload did not finish (starvation or deadlock)"
            self.step(**kw)

    def _end(self, rid: str, how: str) -> None:
        t = self.requests[rid]
        t.finished, t.finished_by = True, how

    # --- the forward ----------------------------------------------------------------------
    def _run_forward(self, fwd: ts.ForwardOp) -> list[object]:
        ps = self.page_size
        ids = fwd.request_ids
        prefix, extend, seq = fwd.prefix_lens, fwd.extend_lens, fwd.seq_lens
        inputs, mask, tables = fwd.input_ids, fwd.sample_mask, fwd.block_tables
        assert not tables.flags.writeable and not inputs.flags.writeable
        assert len(set(fwd.request_pool_indices.tolist())) == len(ids)
        assert tables.shape[0] == len(ids)
        offset = 0
        sampled: list[tuple[str, list[int]]] = []
        for i, rid in enumerate(ids):
            t = self.requests[rid]
            assert not t.finished, f"{rid} scheduled after it finished"
            p, e, s = int(prefix[i]), int(extend[i]), int(seq[i])
            assert s == p + e
            row = tables[i].tolist()
            pages = -(-s // ps)
            assert all(x >= 0 for x in row[:pages]) and all(x == -1 for x in row[pages:]), row
            is_decode = i < fwd.num_decode
            # Reads: every earlier position holds this request's own token.
            for pos in range(p):
                slot = self.device[row[pos // ps]][pos % ps]
                assert slot == (pos, t.tokens[pos]), (rid, pos, slot, t.tokens[pos])
            # Writes.
            if is_decode:
                assert p == len(t.tokens) - 1 and e == self.k
                assert int(inputs[offset]) == t.tokens[-1]
                drafts = [self.rng.randrange(self.vocab) for _ in range(self.k - 1)]
                written = [t.tokens[-1], *drafts]
                offset += 1
            else:
                written = inputs[offset : offset + e].tolist()
                assert written == t.tokens[p : p + e], (rid, p, e)
                offset += e
                assert bool(mask[i]) == (s == len(t.tokens))
                drafts = []
            for j, tok in enumerate(written):
                pos = p + j
                self.device[row[pos // ps]][pos % ps] = (pos, tok)
            if mask[i]:
                accepted = self.rng.randint(0, len(drafts)) if drafts else 0
                sampled.append((rid, [*drafts[:accepted], self.rng.randrange(self.vocab)]))
        assert offset == len(inputs)
        for rid, toks in sampled:
            t = self.requests[rid]
            room = min(t.max_new - t.outputs, self.max_model_len - len(t.tokens))
            t.tokens.extend(toks[:room])
            t.outputs += min(len(toks), room)
        if self.use_forward_result and self.rng.random() < 0.5:
            flat = np.array([x for _, toks in sampled for x in toks], dtype=np.int32)
            counts = [len(toks) for _, toks in sampled]
            return [ts.ForwardResult(fwd.forward_id, flat, counts)]
        return [ts.ExtendResult(rid, toks) for rid, toks in sampled]

    def _check_scheduler_finishes(self) -> None:
        for rid in self.unfinished():
            t = self.requests[rid]
            if t.outputs >= t.max_new or len(t.tokens) >= self.max_model_len:
                st = self.sched.request_stats(rid)
                assert st.finished and st.finish_reason == "length", st
                self._end(rid, "length")

    # --- invariants -----------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Everything the issue asks to hold after every step."""
        self.sched.check_invariants()
        cfg = self.sched.config
        owners = self.sched.page_owners()
        # Each page is free or owned by exactly one owner.
        device_seen = owners["device_free"] + owners["tree_device"]
        for pages in owners["request_private"].values():
            device_seen += pages
        assert sorted(device_seen) == list(range(cfg.num_device_pages)), "device page ownership"
        host_seen = owners["host_free"] + owners["tree_host"]
        assert sorted(host_seen) == list(range(cfg.num_host_pages)), "host page ownership"
        # Stats add up.
        st = self.sched.stats()
        snap = self.sched.cache_snapshot(1 << 30)
        assert not snap["truncated"]
        private = sum(len(p) for p in owners["request_private"].values())
        locked = sum(len(n["device_pages"]) for n in snap["nodes"] if n["lock_count"] > 0)
        tree_pages = sum(len(n["device_pages"]) for n in snap["nodes"])
        assert st.device_pages_total == cfg.num_device_pages
        assert st.device_pages_free == len(owners["device_free"])
        assert st.device_pages_active == private + locked
        assert st.device_pages_cached == tree_pages - locked == st.device_pages_evictable
        assert (
            st.host_pages_free + st.host_pages_active + st.host_pages_cached == cfg.num_host_pages
        )
        counts = st.num_waiting + st.num_prefilling + st.num_decoding + st.num_retracted
        assert counts == len(self.unfinished()) == self.sched.num_requests
        assert st.num_prefilling + st.num_decoding <= cfg.max_batch_size
        # Replaying KV events yields exactly the tree's blocks on each tier.
        if cfg.enable_kv_events:
            self._replay(self.sched.drain_kv_events())
            device_hashes = {
                h for n in snap["nodes"] if n["device_pages"] for h in n["block_hashes"]
            }
            host_hashes = {h for n in snap["nodes"] if n["host_pages"] for h in n["block_hashes"]}
            assert self.gpu_blocks == device_hashes, "GPU events differ from the tree"
            assert self.cpu_blocks == host_hashes, "CPU events differ from the tree"
        # A prefix hit is only reported for a prefix some request really had.
        for rid in self.unfinished():
            cached = self.sched.request_stats(rid).cached_tokens
            if cached:
                mine = self.requests[rid].tokens[:cached]
                assert any(
                    seq is not self.requests[rid].tokens and seq[:cached] == mine
                    for seq in self.all_sequences
                ), f"{rid} reports {cached} cached tokens no other request had"

    def _replay(self, events: list[object]) -> None:
        ps = self.page_size
        for ev in events:
            wire = ev.to_wire()
            if isinstance(ev, ts.BlockStored):
                assert wire[0] == "BlockStored" and wire[4] == ps and wire[5] is None
                blocks = self.gpu_blocks if ev.medium == "GPU" else self.cpu_blocks
                parent = ev.parent_block_hash
                assert parent is None or parent in blocks, "stored under an unknown parent"
                expect = ts.rolling_hash(ev.token_ids, ps, parent or 0)
                assert expect == list(ev.block_hashes), "block hashes do not chain"
                assert not blocks & set(ev.block_hashes), "block stored twice"
                blocks.update(ev.block_hashes)
            elif isinstance(ev, ts.BlockRemoved):
                blocks = self.gpu_blocks if ev.medium == "GPU" else self.cpu_blocks
                assert set(ev.block_hashes) <= blocks, "removing a block never stored"
                blocks.difference_update(ev.block_hashes)
            else:
                assert wire == ("AllBlocksCleared",)
                self.gpu_blocks.clear()
                self.cpu_blocks.clear()
