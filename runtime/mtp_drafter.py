"""Drafts from the checkpoint's multi-token-prediction layer (`--speculative-algorithm MTP`).

DeepSeek-V3 and R1 (and V3.1/V3.2) ship one MTP layer, trained to read the target model's
final hidden state at position ``i`` and the token at ``i + 1`` and predict the token at
``i + 2``. Its attention has a KV cache of its own: one more latent layer in the same pool
pages (layer ``num_hidden_layers``), so prefix caching, retraction, write-back and load-back
carry it with the target's.

* ``observe`` (after every step): the layer runs over every position whose KV the step kept
  (a prefill chunk, a decode token, a verified block's accepted positions), from the
  target's hidden states there and the token after each (the request's history). Its cache
  then covers everything the target's does, and the last position's output gives the first
  draft and the hidden state to continue from.
* ``propose`` (before a decode step): each further draft is one more run of the layer, a
  one-row decode at the next position from the previous draft and hidden state (the chain of
  EAGLE/MTP with one candidate per step). Those positions' entries are rewritten by the next
  ``observe`` with the target's own hidden states.

On CUDA both run as captured graphs where they fit (``MTPStep``, one ``CudaGraphRunner`` of
one-row decodes beside the target's): a decode step's observe and every chained draft are
one-row decodes of the layer, each row with its own table and length, which is the shape of
the target's decode graphs. Extend steps (prefill chunks) run eagerly.

Pages shared through the prefix cache carry the layer's entries with the target's. Each
entry saw the token after its position in the request that computed it; where requests
diverge right after a shared page, that page's last entry saw another request's next token.
A conversation that grows turn by turn (the agentic case) reuses only its own history, so its
entries stay exact. A stale entry only weakens drafts: every draft is verified, so outputs
never depend on the drafter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from tokenspeed.runtime.drafting import Drafts, StepRecord, TokenHistory
from tokenspeed.runtime.forward_batch import (
    ForwardBatch,
    ForwardMode,
    SyntheticOp,
    make_forward_batch,
    segments,
)

if TYPE_CHECKING:
    from tokenspeed.runtime.cuda_graph_runner import CudaGraphRunner
    from tokenspeed.runtime.models.deepseek_v2 import DeepseekMTPLayer


class MTPStep(torch.nn.Module):
    """The MTP layer in the model signature a ``CudaGraphRunner`` captures: the hidden
    states it reads sit in a static buffer, written before each replay."""

    def __init__(self, layer: DeepseekMTPLayer, rows: int, hidden_size: int,
                 dtype: torch.dtype, device: torch.device) -> None:  # fmt: skip
        super().__init__()
        self.layer = layer
        self.hidden = torch.zeros(rows, hidden_size, dtype=dtype, device=device)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        return self.layer.predict(input_ids, positions, self.hidden[: len(input_ids)], batch)


class MTPDrafter:
    """Per-slot first draft and hidden state, and the MTP layer runs that produce them."""

    def __init__(
        self,
        layer: DeepseekMTPLayer,
        backend: object,
        page_size: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
        capacity: int,
    ) -> None:
        self.layer = layer
        self.backend = backend
        self.graphs: CudaGraphRunner | None = None  # one-row decodes of the layer (CUDA)
        self.page_size = page_size
        self.device = device
        self._pin = device.type == "cuda"
        self.history = TokenHistory(capacity)
        self.ready = np.zeros(capacity, dtype=bool)  # the slot's first draft is current
        self.first = torch.zeros(capacity, dtype=torch.int64, device=device)
        self.carry = torch.zeros(capacity, hidden_size, dtype=dtype, device=device)

    def _ensure(self, slot: int) -> None:
        have = len(self.ready)
        if slot < have:
            return
        n = max(slot + 1, 2 * have)
        self.ready = np.concatenate([self.ready, np.zeros(n - have, dtype=bool)])
        self.first = torch.cat([self.first, self.first.new_zeros(n - have)])
        self.carry = torch.cat([self.carry, self.carry.new_zeros(n - have, self.carry.shape[1])])

    def install(self, slot: int, tokens: list[int]) -> None:
        """A request's history now lives in ``slot``; it has no draft until its next step."""
        self._ensure(slot)
        self.history.install(slot, tokens)
        self.ready[slot] = False

    # ---- after a step ---------------------------------------------------------------------
    def observe(self, step: StepRecord) -> None:
        """Run the layer over the step's kept positions; note each sampled request's draft."""
        self.history.observe_tokens(step)
        if step.hidden is None or not len(step.slots):
            return
        slots, starts = step.slots, step.starts
        # each kept position's next token is in the history (prompt, or what was gained): the
        # positions whose next token is not known yet (a block's last) are left out
        room = self.history.lengths(slots) - 1 - starts
        valid = np.maximum(np.minimum(step.valid, room), 0)
        gained = (step.gained > 0) & (valid > 0)
        live = np.flatnonzero(valid > 0)
        if not len(live):
            return
        slots, starts, valid, gained = slots[live], starts[live], valid[live], gained[live]
        owner, within = segments(valid)
        rows = step.row_starts[live][owner] + within
        ids = self.history.gather(slots[owner], starts[owner] + 1 + within)
        tables = self._narrow(step.tables[live], int((starts + valid).max()))
        if step.decode:  # a short block each: one decode row per position (absorbed MLA)
            positions = starts[owner] + within
            last = np.zeros(len(owner), dtype=bool)
            last[np.cumsum(valid) - 1] = gained
            op = SyntheticOp(ForwardMode.DECODE, [], slots[owner], positions,
                             np.ones(len(owner), np.int64), positions + 1, ids, tables[owner],
                             last, num_decode=len(owner))  # fmt: skip
        else:
            op = SyntheticOp(ForwardMode.EXTEND, [], slots, starts, valid, starts + valid, ids,
                             tables, gained)  # fmt: skip
        hidden_rows = torch.from_numpy(rows).to(self.device, non_blocking=self._pin)
        with torch.inference_mode():
            out, batch = self._predict(op, None, step.hidden[hidden_rows])
            if len(batch.sample_rows_np):
                last_hidden = out[batch.sample_indices]
                done = torch.from_numpy(slots[gained]).to(self.device, non_blocking=self._pin)
                self.first[done] = self.layer.compute_logits(last_hidden).argmax(-1)
                self.carry[done] = last_hidden
        self.ready[slots[gained]] = True

    # ---- before a decode step ---------------------------------------------------------------
    def propose(
        self, slots: np.ndarray, positions: np.ndarray, tables: np.ndarray, count: int
    ) -> Drafts:
        """``count`` drafts for each slot with a current first draft (none for the others):
        the first, then ``count - 1`` one-row decodes of the layer at ``positions``,
        ``positions + 1``, ... (each request's last token sits at ``positions``)."""
        ok = np.flatnonzero(self.ready[slots]) if count > 0 else np.zeros(0, np.int64)
        lens = np.zeros(len(slots), dtype=np.int64)
        if not len(ok):
            return Drafts(lens, np.zeros(0, dtype=np.int64))
        sel, pos = slots[ok], positions[ok].astype(np.int64)
        tables = self._narrow(tables[ok], int(pos.max()) + count)
        sel_t = torch.from_numpy(sel).to(self.device, non_blocking=self._pin)
        with torch.inference_mode():
            drafts = [self.first[sel_t]]
            hidden = self.carry[sel_t]
            for j in range(count - 1):
                p = pos + j
                op = SyntheticOp(ForwardMode.DECODE, [], sel, p, np.ones(len(sel), np.int64),
                                 p + 1, np.zeros(len(sel), np.int64), tables,
                                 np.ones(len(sel), bool), num_decode=len(sel))  # fmt: skip
                hidden, _ = self._predict(op, drafts[-1], hidden)
                drafts.append(self.layer.compute_logits(hidden).argmax(-1))
            # the one host sync of drafting: the verify step's inputs are built on the host
            host = torch.stack(drafts, dim=1).cpu().numpy()
        lens[ok] = count
        return Drafts(lens, host.reshape(-1).astype(np.int64))

    # ---- helpers -------------------------------------------------------------------------------
    def _narrow(self, tables: np.ndarray, max_len: int) -> np.ndarray:
        """The columns of ``tables`` that positions below ``max_len`` use."""
        return np.asarray(tables)[:, : max(1, -(-max_len // self.page_size))]

    def graph_module(self, rows: int) -> MTPStep:
        """The layer as a ``CudaGraphRunner`` captures it, for batches of up to ``rows``."""
        return MTPStep(self.layer, rows, self.carry.shape[1], self.carry.dtype, self.device)

    def _predict(
        self, op: SyntheticOp, input_ids: torch.Tensor | None, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, ForwardBatch]:
        """The layer's output rows for ``op`` (its ids, or ``input_ids`` already on the
        device), from a captured graph where one holds the batch, else eagerly. A graph's
        output is its runner's static buffer: read it before the next replay."""
        batch = make_forward_batch(op, self.page_size, self.device, pin=self._pin)
        batch.extras["attn_backend"] = self.backend
        if input_ids is not None:
            batch.input_ids = input_ids
        runner = self.graphs
        if runner is not None and runner.can_run(batch):
            runner.model.hidden[: batch.batch_size].copy_(hidden)
            return runner.replay(batch), batch
        self.backend.init_forward_metadata(batch)  # type: ignore[attr-defined]
        return self.layer.predict(batch.input_ids, batch.positions, hidden, batch), batch
