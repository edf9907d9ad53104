"""ModelExecutor: runs the forward op of an execution plan and the plan's cache ops.

It owns the model, the KV pools, the attention backend and the sampling state. It never
decides who runs: it executes what the scheduler planned and returns the sampled tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tokenspeed.runtime.cuda_graph_runner import CudaGraphRunner
from tokenspeed.runtime.drafting import Drafter, StepRecord
from tokenspeed.runtime.forward_batch import (
    ForwardBatch,
    ForwardMode,
    SyntheticOp,
    make_forward_batch,
    segments,
)
from tokenspeed.runtime.kv_pool import (
    AnyKVLayout,
    HostKVPool,
    KVLayout,
    cuda_kv_budget_bytes,
    load_back,
    make_kv_pool,
    pages_for_budget,
    write_back,
)
from tokenspeed.runtime.layers.attention import create_attention_backend
from tokenspeed.runtime.model_loader import HFConfig, load_model
from tokenspeed.runtime.mtp_drafter import MTPDrafter
from tokenspeed.runtime.ngram_drafter import NgramDrafter
from tokenspeed.runtime.sampling import SamplingParams, SamplingState, sample

if TYPE_CHECKING:
    from tokenspeed.runtime.grammar.backend import RequestGrammar

_KV_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_FP8_KV_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn}


def resolve_device(device: str | torch.device) -> torch.device:
    """``auto`` means CUDA when present, else CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


@dataclass
class ExecutorConfig:
    """What the executor needs from the server args (read by name, so it stays decoupled)."""

    model_path: str | Path
    dtype: str = "auto"
    device: str = "auto"
    load_format: str = "auto"
    hf_overrides: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    page_size: int = 16
    max_total_tokens: int | None = None
    kv_cache_memory: int | None = 256 << 20
    gpu_memory_utilization: float = 0.9
    host_kv_cache_memory: int = 0
    num_host_pages: int | None = None  # explicit page count wins over host_kv_cache_memory
    max_model_len: int | None = None
    max_num_seqs: int = 256
    chunked_prefill_size: int = 8192
    attention_backend: str = "auto"
    kv_cache_dtype: str = "auto"
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int | None = None
    speculative_algorithm: str | None = None
    speculative_num_draft_tokens: int = 4  # tokens a decode step may verify (drafts + 1)

    @classmethod
    def from_server_args(cls, args: Any, model_path: str | Path) -> ExecutorConfig:
        """Pick the executor's fields out of a ``ServerArgs`` (missing ones keep defaults)."""
        values: dict[str, Any] = {"model_path": model_path}
        for name in cls.__dataclass_fields__:
            if name != "model_path" and getattr(args, name, None) is not None:
                values[name] = getattr(args, name)
        return cls(**values)


@dataclass
class StepOutput:
    """Host-side results of one forward: a token per sampled request (+ logprobs)."""

    rows: np.ndarray  # batch rows that were sampled (the op's request_ids name them)
    tokens: np.ndarray  # [S] int64
    logprobs: np.ndarray | None = None  # [S]
    top_ids: np.ndarray | None = None  # [S, K]
    top_logprobs: np.ndarray | None = None  # [S, K]
    logits: torch.Tensor | None = None  # [S, V] float32, only when asked (tests)
    grammar_done: np.ndarray | None = None  # [S] bool: the row's grammar is complete
    # speculative decoding: tokens per sampled request (``tokens`` then holds them all, in
    # order, and logprobs follow them); None means one each
    counts: np.ndarray | None = None
    drafted: np.ndarray | None = None  # [S] drafts each sampled request's block carried


class ModelExecutor:
    """Loads the model, sizes and owns the KV pools, executes forward and cache ops."""

    def __init__(self, config: ExecutorConfig) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        torch.manual_seed(config.seed)
        self._pin = self.device.type == "cuda"
        self.pages_written_back = 0  # counters for stats and tests
        self.pages_loaded_back = 0
        self.graph_runner: CudaGraphRunner | None = None
        self.verify_graph_runner: CudaGraphRunner | None = None  # multi-token verify (MLA)
        self.model, self.hf_config, self.dtype = load_model(
            config.model_path,
            dtype=config.dtype,
            device=self.device,
            load_format=config.load_format,
            hf_overrides=config.hf_overrides,
            max_model_len=config.max_model_len,
            seed=config.seed,
        )
        cfg: HFConfig = self.hf_config
        self.max_model_len = int(config.max_model_len or cfg.max_position_embeddings)
        self.page_size = int(config.page_size)
        mtp_layer = self._mtp_layer() if config.speculative_algorithm == "MTP" else None
        self.layout = self._kv_layout(cfg, config.kv_cache_dtype, int(mtp_layer is not None))
        self.kv_pool = make_kv_pool(self.layout, self._num_device_pages(), self.device)
        pin = self.device.type == "cuda"
        host_pages = config.num_host_pages
        if host_pages is None:
            host_pages = int(config.host_kv_cache_memory or 0) // self.layout.bytes_per_page
        self.host_pool = HostKVPool(self.layout, host_pages, pin=pin) if host_pages else None
        self.attn_backend = create_attention_backend(config.attention_backend, self.kv_pool)
        self.sampling = SamplingState(config.max_num_seqs, cfg.vocab_size, self.device)
        # speculative decoding: drafts (n-gram lookup or the MTP layer) checked by the model
        self.drafter: Drafter | None = None
        self.spec_tokens = 1
        if config.speculative_algorithm == "NGRAM":
            self.drafter = NgramDrafter(config.max_num_seqs)
        elif mtp_layer is not None:
            self.drafter = MTPDrafter(
                mtp_layer,
                self.attn_backend,
                self.page_size,
                cfg.hidden_size,
                self.dtype,
                self.device,
                config.max_num_seqs,
            )
        if self.drafter is not None:
            self.spec_tokens = int(config.speculative_num_draft_tokens)
        self.spec_drafted = 0  # drafts proposed and accepted so far (stats, tests)
        self.spec_accepted = 0
        self.spec_blocks = 0  # drafted blocks verified (a request's drafts in one step)
        self.spec_multi_token_steps = 0  # verify steps run as q_len > 1 queries (MLA)
        if self.device.type == "cuda" and not config.disable_cuda_graph:
            self._init_cuda_graphs()

    def _init_cuda_graphs(self) -> None:
        """Decode graphs, and with speculative decoding on a ``multi_token_decode`` backend
        (MLA) graphs of verify steps whose blocks are ``spec_tokens``-token queries; with MTP
        drafts, graphs of the MTP layer's one-row decodes."""
        # a speculative verify step decodes one row per drafted position
        rows = self.config.max_num_seqs * self.spec_tokens
        max_bs = int(self.config.cuda_graph_max_bs or min(rows, 256))
        max_pages = -(-self.max_model_len // self.page_size)
        self.attn_backend.init_cuda_graph_state(max_bs, max_pages)  # shared by the runners
        common = dict(max_bs=max_bs, max_pages_per_req=max_pages,
                      hidden_size=self.hf_config.hidden_size, dtype=self.dtype)  # fmt: skip
        runner = CudaGraphRunner(self.model, self.attn_backend, self.kv_pool, **common)
        if not runner.capture():
            return
        self.graph_runner = runner
        multi = self.attn_backend.multi_token_decode
        if self.spec_tokens > 1 and multi and max_bs >= self.spec_tokens:
            verify = CudaGraphRunner(self.model, self.attn_backend, self.kv_pool, **common,
                                     q_len=self.spec_tokens, pool=runner.pool)  # fmt: skip
            if verify.capture():
                self.verify_graph_runner = verify
        if isinstance(self.drafter, MTPDrafter):  # the layer's one-row decodes
            mtp = CudaGraphRunner(self.drafter.graph_module(max_bs), self.attn_backend,
                                  self.kv_pool, **common, pool=runner.pool)  # fmt: skip
            if mtp.capture():
                self.drafter.graphs = mtp

    def _mtp_layer(self) -> Any:
        """The checkpoint's first multi-token-prediction layer (DeepSeek-V3's form)."""
        layers = getattr(getattr(self.model, "model", None), "mtp_layers", None)
        if not layers:
            raise ValueError(
                "speculative_algorithm MTP drafts with the checkpoint's multi-token-prediction "
                f"layer, and this {self.hf_config.architecture} checkpoint has none "
                "(num_nextn_predict_layers and its weights; DeepSeek-V3 and R1 ship one, Kimi K2 "
                "none)"
            )
        return layers[0]

    # ---- sizing -------------------------------------------------------------------------
    def _kv_layout(self, cfg: HFConfig, kv_cache_dtype: str, draft_layers: int = 0) -> AnyKVLayout:
        """The model's own cache layout (MLA latent) if it declares one, else paged MHA;
        ``draft_layers`` more latent layers for an MTP drafter."""
        model_layout = getattr(self.model, "kv_cache_layout", None)
        dtype = self._kv_dtype(kv_cache_dtype, latent=model_layout is not None)
        if model_layout is not None:
            return model_layout(self.page_size, dtype, draft_layers=draft_layers)
        return KVLayout(
            num_layers=cfg.num_layers,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            v_head_dim=cfg.head_dim,
            page_size=self.page_size,
            dtype=dtype,
        )

    def _kv_dtype(self, name: str, latent: bool = False) -> torch.dtype:
        """``--kv-cache-dtype``: FP8 (e4m3, per-token scales) exists for the MLA latent cache."""
        if name == "auto":
            return self.dtype
        if name in _KV_DTYPES:
            return _KV_DTYPES[name]
        if latent and name in _FP8_KV_DTYPES:
            return _FP8_KV_DTYPES[name]
        if latent:
            raise ValueError(
                f"kv cache dtype {name!r} is not supported by the MLA latent cache "
                f"(use auto, {' or '.join(_FP8_KV_DTYPES)})"
            )
        raise ValueError(
            f"kv cache dtype {name!r} is not supported by the paged backend yet (use auto)"
        )

    def _num_device_pages(self) -> int:
        cfg = self.config
        if cfg.max_total_tokens:
            return pages_for_budget(self.layout, cfg.max_total_tokens, None)
        if self.device.type != "cuda":
            return pages_for_budget(self.layout, None, cfg.kv_cache_memory)
        peak = self._profile_peak_bytes()
        budget = cuda_kv_budget_bytes(self.device, cfg.gpu_memory_utilization, peak)
        return pages_for_budget(self.layout, None, budget)

    def _profile_peak_bytes(self) -> int:
        """Run the largest step the scheduler may plan on a throwaway pool; return torch's peak."""
        tokens = int(min(self.config.chunked_prefill_size, self.max_model_len))
        pages = -(-tokens // self.page_size)
        pool = make_kv_pool(self.layout, pages, self.device)
        backend = create_attention_backend(self.config.attention_backend, pool)
        op = SyntheticOp.prefill(tokens, pages, self.page_size)
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self._run_model(op, backend, want_logits=False)
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        del pool, backend
        torch.cuda.empty_cache()
        return int(peak)

    @property
    def num_device_pages(self) -> int:
        return self.kv_pool.num_pages

    @property
    def num_host_pages(self) -> int:
        return self.host_pool.num_pages if self.host_pool else 0

    # ---- requests -----------------------------------------------------------------------
    def install_request(
        self,
        slot: int,
        params: SamplingParams,
        seed: int,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        stop_ids: Sequence[int] = (),
        grammar: RequestGrammar | None = None,
    ) -> None:
        """Bind a request's sampling state (and grammar matcher) to its pool slot (admission
        or re-admission)."""
        self.sampling.install(
            slot, params, seed, list(prompt_ids), list(output_ids), list(stop_ids), grammar
        )
        if self.drafter is not None:
            self.drafter.install(slot, [*prompt_ids, *output_ids])

    def release_grammar(self, slot: int) -> None:
        """Drop a finished request's matcher from its slot (its compiled grammar can go)."""
        self.sampling.release_grammar(slot)

    # ---- execution ----------------------------------------------------------------------
    def _run_model(
        self, op: Any, backend: Any, want_logits: bool, allow_graph: bool = False
    ) -> tuple[ForwardBatch, torch.Tensor, torch.Tensor | None]:
        """The step's batch, hidden states of every row, and logits of the sampled rows."""
        batch = make_forward_batch(op, self.page_size, self.device, pin=self._pin)
        batch.extras["attn_backend"] = backend
        q_len = int(getattr(op, "decode_q_len", 1))
        if q_len > 1:  # speculative blocks as multi-token queries
            batch.extras["decode_q_len"] = q_len
        runner = None
        if allow_graph:
            runner = self.verify_graph_runner if q_len > 1 else self.graph_runner
        with torch.inference_mode():
            if runner is not None and runner.can_run(batch):
                hidden = runner.replay(batch)
            else:
                backend.init_forward_metadata(batch)
                hidden = self.model(batch.input_ids, batch.positions, batch)
            if not want_logits or len(batch.sample_rows_np) == 0:
                return batch, hidden, None
            return batch, hidden, self.model.compute_logits(hidden[batch.sample_indices])

    def execute(self, op: Any, return_logits: bool = False) -> StepOutput:
        """Run one forward op; sample every request the op marks as sampled."""
        if ForwardMode.of(op.mode) is ForwardMode.IDLE or op.batch_size == 0:
            return StepOutput(np.zeros(0, np.int64), np.zeros(0, np.int64))
        verify: _Verify | None = None
        if self.drafter is not None:
            op, verify = self._with_drafts(op)
        batch, hidden, logits = self._run_model(
            op, self.attn_backend, want_logits=True, allow_graph=True
        )
        rows = batch.sample_rows_np
        if logits is None:
            result = StepOutput(rows, np.zeros(0, np.int64))
        elif verify is not None:
            result = self._verify(logits, verify)
        else:
            result = self._sample(batch, logits, return_logits)
        if self.drafter is not None:
            self.drafter.observe(self._step_record(op, verify, result, hidden))
        return result

    def _sample(self, batch: ForwardBatch, logits: torch.Tensor, return_logits: bool) -> StepOutput:
        """One token for each sampled request."""
        rows = batch.sample_rows_np
        slots = batch.pool_indices_np[rows]
        with torch.inference_mode():
            sb = self.sampling.gather(slots)
            out = sample(logits, sb, self.sampling)
            self.sampling.record(slots, sb, out.tokens)
        # The one host sync per step: stop checks and the scheduler need the tokens.
        result = StepOutput(rows, out.tokens.cpu().numpy())
        result.grammar_done = self.sampling.advance_grammars(sb, result.tokens)
        if out.logprobs is not None:
            result.logprobs = out.logprobs.cpu().numpy()
        if out.top_ids is not None and out.top_logprobs is not None:
            result.top_ids = out.top_ids.cpu().numpy()
            result.top_logprobs = out.top_logprobs.cpu().numpy()
        if return_logits:
            result.logits = logits
        return result

    # ---- speculative decoding (NGRAM) ----------------------------------------------------
    def _with_drafts(self, op: Any) -> tuple[Any, _Verify | None]:
        """The op to run for the scheduler's ``op`` (which reserved ``spec_tokens`` positions
        per decode request), and what to verify after it.

        A pure decode step with drafts runs as a decode of one row per position: request i's
        rows are its last token then its drafts, at positions p_i, p_i + 1, ..., each row
        attending to the KV up to itself (every row's KV is stored before attention runs), so
        the decode kernels and their CUDA graphs verify the block; a backend with
        ``multi_token_decode`` (MLA) reads each block, padded to the step's widest, as one
        query of that many tokens. A mixed step runs as an extend whose decode rows are the
        blocks. Without any draft the step is the plain one-token decode."""
        mode = ForwardMode.of(op.mode)
        num_decode = op.batch_size if mode is ForwardMode.DECODE else int(op.num_decode)
        if mode is ForwardMode.EXTEND or num_decode == 0:
            return op, None
        assert self.drafter is not None
        pool = np.asarray(op.request_pool_indices, dtype=np.int64)
        prefix = np.asarray(op.prefix_lens, dtype=np.int64)
        tables = np.asarray(op.block_tables)
        lens = np.zeros(num_decode, dtype=np.int64)
        flat_drafts = np.zeros(0, dtype=np.int64)
        can = np.flatnonzero(self.sampling.speculable(pool[:num_decode]))
        if len(can):
            # the pages this step reserved cover every draft's position
            width = -(-int(prefix[can].max() + self.spec_tokens) // self.page_size)
            proposed = self.drafter.propose(
                pool[can], prefix[can], tables[can, :width], self.spec_tokens - 1
            )
            # ``can`` ascends, so the drafts stay in request order
            lens[can] = proposed.lens
            flat_drafts = proposed.tokens
        extend = np.asarray(op.extend_lens, dtype=np.int64).copy()
        ids = np.asarray(op.input_ids, dtype=np.int64)
        mask = np.asarray(op.sample_mask, dtype=bool)
        if not lens.any():  # the plain decode: one position per decode request
            extend[:num_decode] = 1
            view = SyntheticOp(mode, [], pool, prefix, extend, prefix + extend, ids, tables,
                               mask, num_decode=num_decode)  # fmt: skip
            return view, None
        self.spec_drafted += int(lens.sum())
        self.spec_blocks += int(np.count_nonzero(lens))
        # each decode request's block: its last token, then its drafts
        per = 1 + lens
        owner, within = segments(per)
        block_tokens = np.empty(len(owner), dtype=np.int64)
        block_tokens[within == 0] = ids[:num_decode]
        block_tokens[within > 0] = flat_drafts
        if mode is ForwardMode.DECODE:
            q_len = 1
            if self.attn_backend.multi_token_decode:
                # every block padded to the widest, or to the verify graphs' width, by
                # repeating its last token (the padding's tokens are never kept)
                q_len = self.spec_tokens if self.verify_graph_runner else int(per.max())
                padded = np.full(num_decode, q_len, dtype=np.int64)
                owner, within = segments(padded)
                last = np.cumsum(per) - 1
                block_tokens = block_tokens[last[owner] - np.maximum(per[owner] - 1 - within, 0)]
                per = padded
                self.spec_multi_token_steps += 1
            positions = prefix[owner] + within
            rows = len(owner)
            view = SyntheticOp(ForwardMode.DECODE, [], pool[owner], positions,
                               np.ones(rows, np.int64), positions + 1, block_tokens,
                               tables[owner], np.ones(rows, bool), num_decode=rows,
                               decode_q_len=q_len)  # fmt: skip
            blocks = _Blocks(pool[:num_decode], prefix[:num_decode], per, tables[:num_decode])
            verify = _Verify(np.arange(num_decode), per, pool[:num_decode], lens, flat_drafts,
                             num_decode)  # fmt: skip
            verify.blocks = blocks
            return view, verify
        extend[:num_decode] = per
        counts = np.where(mask, 1, 0).astype(np.int64)
        counts[:num_decode] = per
        view = SyntheticOp(ForwardMode.EXTEND, [], pool, prefix, extend, prefix + extend,
                           np.concatenate([block_tokens, ids[num_decode:]]), tables, mask,
                           sample_counts=counts)  # fmt: skip
        sampled = np.flatnonzero(counts)
        verify = _Verify(sampled, counts[sampled], pool[sampled], lens, flat_drafts, num_decode)
        return view, verify

    def _verify(self, logits: torch.Tensor, v: _Verify) -> StepOutput:
        """Sample every position of each drafted block and keep the drafts up to the first
        one the model would not have sampled itself, then its own token there. Each position
        samples exactly what plain decoding would (same logits, seed and output position), so
        outputs equal the non-speculative ones token for token, greedy or seeded."""
        rows, counts, slots = v.rows, v.counts, v.slots
        row_slots = np.repeat(slots, counts)
        starts = np.cumsum(counts) - counts
        _, offsets = segments(counts)
        with torch.inference_mode():
            sb = self.sampling.gather(row_slots, offsets)
            out = sample(logits, sb, self.sampling)
        sampled = out.tokens.cpu().numpy()
        # The decode requests are the first ``num_decode`` sampled rows. What a block samples
        # at its position k is the model's own choice for draft k: a request keeps its drafts
        # up to the first that differs, plus the model's token there (a padded block has more
        # positions than drafts; they are never kept).
        accepted = np.ones(len(rows), dtype=np.int64)
        accepted[: v.num_decode] += v.draft_lens
        owner, within = segments(v.draft_lens)
        misses = np.flatnonzero(sampled[starts[owner] + within] != v.flat_drafts)
        missed, first = np.unique(owner[misses], return_index=True)
        accepted[missed] = within[misses[first]] + 1
        keep = offsets < np.repeat(accepted, counts)
        with torch.inference_mode():
            self.sampling.record(slots, sb, out.tokens, advance=accepted)
        self.spec_accepted += int((accepted - 1).sum())
        tokens = sampled[keep]
        drafted = np.zeros(len(rows), dtype=np.int64)
        drafted[: v.num_decode] = v.draft_lens
        result = StepOutput(rows, tokens, counts=accepted, drafted=drafted)
        done = self.sampling.advance_grammars(sb, sampled)  # grammar rows are single rows
        if done is not None:
            result.grammar_done = done[starts]
        if out.logprobs is not None:
            result.logprobs = out.logprobs.cpu().numpy()[keep]
        if out.top_ids is not None and out.top_logprobs is not None:
            result.top_ids = out.top_ids.cpu().numpy()[keep]
            result.top_logprobs = out.top_logprobs.cpu().numpy()[keep]
        return result

    def _step_record(
        self, op: Any, verify: _Verify | None, result: StepOutput, hidden: torch.Tensor
    ) -> StepRecord:
        """What the drafter learns from the step ``op`` (the view that ran) produced."""
        blocks = verify.blocks if verify is not None and verify.blocks is not None else None
        if blocks is None:
            blocks = _Blocks(
                np.asarray(op.request_pool_indices, dtype=np.int64),
                np.asarray(op.prefix_lens, dtype=np.int64),
                np.asarray(op.extend_lens, dtype=np.int64),
                np.asarray(op.block_tables),
            )
        valid = blocks.rows.copy()
        counts = result.counts if result.counts is not None else np.ones(len(result.rows), np.int64)
        gained = np.zeros(len(valid), dtype=np.int64)
        if len(result.tokens):  # (a step that computed no logits sampled nothing)
            gained[result.rows] = counts  # the result's tokens are in row order
        if verify is not None:  # a verified block keeps the positions it accepted
            blocks_rows = result.rows < verify.num_decode
            valid[result.rows[blocks_rows]] = counts[blocks_rows]
        return StepRecord(
            slots=blocks.slots,
            starts=blocks.starts,
            valid=valid,
            row_starts=np.cumsum(blocks.rows) - blocks.rows,
            gained=gained,
            gained_tokens=np.asarray(result.tokens, dtype=np.int64),
            tables=blocks.tables,
            hidden=hidden,
            decode=ForwardMode.of(op.mode) is ForwardMode.DECODE,
        )

    def write_back(self, device_pages: Any, host_pages: Any) -> None:
        """Copy device pages to the host tier (plan's ``WriteBackOp``)."""
        if self.host_pool is None:
            raise RuntimeError("write-back planned but no host KV pool was configured")
        write_back(self.kv_pool, self.host_pool, device_pages, host_pages)
        self.pages_written_back += len(device_pages)

    def load_back(self, host_pages: Any, device_pages: Any) -> None:
        """Copy host pages into device pages (plan's ``LoadBackOp``)."""
        if self.host_pool is None:
            raise RuntimeError("load-back planned but no host KV pool was configured")
        load_back(self.host_pool, self.kv_pool, host_pages, device_pages)
        self.pages_loaded_back += len(device_pages)


@dataclass
class _Blocks:
    """Each request of the scheduler's op in the view that ran: pool slot, first position,
    rows in the view (in order) and block table."""

    slots: np.ndarray
    starts: np.ndarray
    rows: np.ndarray
    tables: np.ndarray


@dataclass
class _Verify:
    """A step's drafted blocks: for each sampled request (``rows`` of the scheduler's op;
    the decode requests, op rows ``0 .. num_decode - 1``, first), its sampled positions
    (``counts``, in order in the logits) and pool slot; each decode request's draft count,
    and all the drafts in one array (in request order). ``blocks``: the op's requests when
    the view has a row per position (a decode), else the view's own."""

    rows: np.ndarray
    counts: np.ndarray
    slots: np.ndarray
    draft_lens: np.ndarray
    flat_drafts: np.ndarray
    num_decode: int
    blocks: _Blocks | None = None
