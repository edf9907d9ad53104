"""Launch plans of the MLA Triton kernels: defaults, tuning spaces, split-KV and workspace sizing.

Pure Python (no Triton, no tensor reads): the registry asks for a default config when it
selects a kernel, ``tokenspeed tune-kernels``-style searches enumerate the spaces, and
``mla_decode_plan`` sizes the split-KV workspace before a CUDA graph is captured. Every
number here comes from shapes only, so planning never synchronises with the device.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping
from typing import Any

from tokenspeed.kernels.traits import bucket

Traits = Mapping[str, Any]
Config = dict[str, Any]

# Rows (query token x head pairs) one decode program owns. 64 rows x 512 fp32 accumulator is
# 128 KiB of registers (half of an SM's file at 8 warps); 128 rows would need the whole file.
MAX_BLOCK_H = 64
# Folding query tokens into the head axis stops at this many rows (the seed's rule).
FOLD_ROW_LIMIT = 128
MAX_SPLITS = 64
MIN_TOKENS_PER_SPLIT = 256


def _pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


@functools.cache
def num_sms() -> int:
    """Streaming multiprocessors of the current GPU (a small stand-in on CPU)."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return 8


@functools.cache
def tma_capable() -> bool:
    """Whether the current GPU has TMA (Hopper or newer); False on CPU."""
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def _grid(**axes: list[Any]) -> list[Config]:
    keys = list(axes)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*axes.values())]


# -- decode ----------------------------------------------------------------------------------


def fold_factor(num_heads: int, q_len: int, requested: int | None = None) -> int:
    """How many query tokens share one row group (``fold_sq_factor``).

    The largest ``F`` dividing ``q_len`` with ``num_heads * F <= 128``, so small-head decode
    with several query tokens (MTP) fills the MMA M dimension; ``1`` when none divides.
    An explicit request must divide ``q_len``.
    """
    if requested is not None:
        if requested < 1 or q_len % requested:
            raise ValueError(f"fold_sq_factor={requested} must divide q_len={q_len}")
        return int(requested)
    best = 1
    for f in range(1, q_len + 1):
        if q_len % f == 0 and num_heads * f <= max(FOLD_ROW_LIMIT, num_heads):
            best = f
    return best


def decode_block_h(rows_per_group: int, wanted: int) -> int:
    """Rows per program: the configured block, shrunk to the group (>= 16 for tl.dot)."""
    return max(16, min(_pow2(wanted), _pow2(rows_per_group)))


def decode_geometry(num_heads: int, q_len: int, fold: int, block_h: int) -> tuple[int, int, int]:
    """(rows per group, row blocks per group, row blocks per request) of a decode launch."""
    rows = num_heads * fold
    per_group = -(-rows // block_h)
    return rows, per_group, per_group * (q_len // fold)


def _ctas_per_sm(block_h: int) -> int:
    # 64 rows: 128 KiB accumulator + the q tile in SMEM -> one CTA per SM; fewer rows -> two.
    return 1 if block_h >= 64 else 2


def decode_num_splits(
    batch: int, row_blocks: int, kv_len: int, block_h: int, sms: int | None = None
) -> int:
    """Split-KV count: the fewest splits that fill the GPU's CTA slots without a ragged wave.

    Every split adds a partial write/read (``rows x 513 x 4`` bytes) and a merge, so prefer
    few; but a launch of fewer programs than CTA slots leaves bandwidth unused. Candidates are
    scored by wave efficiency (programs / (waves x slots)); the smallest split count reaching
    90% wins (else the most efficient). Never fewer than 256 tokens per split.
    """
    slots = max(1, (sms or num_sms()) * _ctas_per_sm(block_h))
    programs = max(1, batch * row_blocks)
    cap = max(1, min(MAX_SPLITS, kv_len // MIN_TOKENS_PER_SPLIT))
    if programs >= 4 * slots:
        return 1

    def efficiency(s: int) -> float:
        total = programs * s
        waves = -(-total // slots)
        return total / (waves * slots)

    for s in range(1, cap + 1):
        if efficiency(s) >= 0.9:
            return s
    return max(range(1, cap + 1), key=efficiency)


def decode_default_config(traits: Traits) -> Config:
    """Untuned decode launch: 64-row blocks when the (folded) heads fill them."""
    heads, q_len = int(traits["num_heads"]), int(traits["q_len"])
    fold = fold_factor(heads, q_len)
    block_h = decode_block_h(heads * fold, MAX_BLOCK_H)
    _, _, row_blocks = decode_geometry(heads, q_len, fold, block_h)
    big = int(traits.get("kv_lora_rank", 512)) >= 256
    splits = decode_num_splits(int(traits["batch"]), row_blocks, int(traits["kv_len"]), block_h)
    page_size = int(traits.get("page_size", 0))
    if big and block_h == 32:
        # 32-row blocks run transposed (KV tokens on M, 16-token tiles, 4 warps): 346 us
        # against 491 us for rows on M at 32 heads x 4096, the same at 16 heads x 2, and 293
        # us with whole tiles by TMA (H100, docs/mla.md)
        return {"block_h": 32, "block_n": 16, "num_warps": 4, "num_stages": 2, "q_reload": 0,
                "tokens_on_m": 1, "tma": int(tma_capable() and page_size % 16 == 0),
                "num_splits": splits}  # fmt: skip
    tile = 64 if block_h >= 64 else 32
    if big and tma_capable() and page_size % tile == 0:
        # whole tiles by TMA (rows on M): at 64 rows 64-token tiles, 8 warps, 2 stages, 297 /
        # 558 us against 468 / 930 us for pointer loads at 64 / 128 heads; at 16 rows 32-token
        # tiles, 229 against 244 us (H100, docs/mla.md)
        return {"block_h": block_h, "block_n": tile, "num_warps": 8 if block_h >= 64 else 4,
                "num_stages": 2, "q_reload": 0, "tokens_on_m": 0, "tma": 1,
                "num_splits": splits}  # fmt: skip
    # SMEM: q tile (BLOCK_H x 576 x 2 B) + stages x BLOCK_N x 576 x 2 B. 32-token tiles keep
    # 64-row blocks at ~150 KiB (one CTA/SM) and 16-row blocks under ~110 KiB (two).
    return {
        "block_h": block_h,
        "block_n": 32 if big else 16,
        "num_warps": 8 if (block_h >= 32 and big) else 4,
        "num_stages": 3 if block_h >= 64 else 2,  # measured on H200: 3 stages -8% at 64 rows
        "q_reload": 0,
        "tokens_on_m": 0,
        "tma": 0,
        "num_splits": splits,
    }


def decode_default_config_fp8(traits: Traits) -> Config:
    """Untuned decode launch over an FP8 cache: the bf16 one, except that 32-row blocks
    (transposed) take pointer loads. With f16 products, 16-token tiles: 412 us at 32 heads
    (per-token scales), against 458 us by TMA and 567 us for 32-token tiles by pointers
    (H200; with bf16 products 32-token tiles led, 615 against 661 us on an H100). With rows
    on M, TMA is 0.93x / 0.63x / 0.62x the time of pointer loads at 16 / 64 / 128 heads
    (H100, docs/mla.md)."""
    cfg = decode_default_config(traits)
    if cfg["tokens_on_m"]:
        cfg.update(block_n=16, tma=0)
    return cfg


def decode_config_space(traits: Traits) -> list[Config]:
    """What tuning tries: row blocks, KV tile, warps, pipeline depth, split counts, layout,
    TMA (where the GPU and the page size allow it, else the launch falls back to pointer
    loads)."""
    base = decode_default_config(traits)["num_splits"]
    splits = sorted({s for s in (1, base // 2, base, base * 2) if 1 <= s <= MAX_SPLITS})
    return [
        c
        for c in _grid(
            block_h=[16, 32, 64],
            block_n=[16, 32, 64],
            num_warps=[4, 8],
            num_stages=[1, 2, 3],
            num_splits=splits,
            q_reload=[0, 1],
            tokens_on_m=[0, 1],
            tma=[0, 1],
        )
        if not (c["block_h"] == 64 and c["block_n"] == 64 and c["num_stages"] > 2)
        # the transposed and the TMA kernels keep q in shared memory; a transposed TMA launch
        # of 64-token tiles reads out of bounds (triton_decode._tma_ok)
        and not ((c["tokens_on_m"] or c["tma"]) and c["q_reload"])
        and not (c["tokens_on_m"] and c["tma"] and c["block_n"] > 32)
    ]


def decode_workspace_bytes(batch: int, q_len: int, num_heads: int, splits: int, dv: int) -> int:
    """Bytes of split-KV scratch: fp32 partial outputs ``[rows, splits, dv]`` then LSEs."""
    if splits <= 1:
        return 0
    rows = batch * q_len * num_heads
    return rows * splits * (dv + 1) * 4


def plan_decode(
    batch: int,
    q_len: int,
    heads: int,
    capacity: int,
    page_size: int,
    *,
    kv_lora_rank: int = 512,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    fold_sq_factor: int | None = None,
    config: Mapping[str, Any] | None = None,
    fp8: bool = False,
) -> dict[str, int]:
    """The launch geometry for a decode call (shapes only): fold, blocks, splits, workspace."""
    kv_len = min(max_seq_len, capacity) if max_seq_len else capacity
    traits = {
        "num_heads": heads,
        "q_len": q_len,
        "kv_lora_rank": kv_lora_rank,
        "page_size": page_size,
        "batch": bucket(batch),
        "kv_len": bucket(kv_len),
    }
    cfg = dict((decode_default_config_fp8 if fp8 else decode_default_config)(traits))
    cfg.update(config or {})
    fold = fold_factor(heads, q_len, fold_sq_factor)
    block_h = decode_block_h(heads * fold, int(cfg["block_h"]))
    rows, per_group, row_blocks = decode_geometry(heads, q_len, fold, block_h)
    splits = int(num_splits) if num_splits else int(cfg["num_splits"])
    splits = max(1, min(splits, max(1, -(-kv_len // int(cfg["block_n"])))))
    return {
        "fold": fold,
        "block_h": block_h,
        "block_n": int(cfg["block_n"]),
        "num_warps": int(cfg["num_warps"]),
        "num_stages": int(cfg["num_stages"]),
        "q_reload": int(cfg.get("q_reload", 0)),
        "tokens_on_m": int(cfg.get("tokens_on_m", 0)),
        "tma": int(cfg.get("tma", 0)),
        "rows_per_group": rows,
        "blocks_per_group": per_group,
        "row_blocks": row_blocks,
        "num_splits": splits,
        "workspace_bytes": decode_workspace_bytes(batch, q_len, heads, splits, kv_lora_rank),
    }


CUTE_TILE = 64  # KV tokens per tile of the CuTe decode
# The plan keys a caller (a benchmark variant, a test, a tuned config) may set.
CUTE_DECODE_KEYS = frozenset({
    "layout", "rows", "wgs", "stages", "fp8_stages", "tile", "lazy_rescale", "rope_early",
    "evict_first", "page_prefetch", "max_slack", "num_splits", "ablation",
})  # fmt: skip


def _default_rows(rows_per_req: int) -> int:
    """Rows per CTA: the fewest of 16, 32 and 64 that hold a request's rows (64 above)."""
    return 16 if rows_per_req <= 16 else 32 if rows_per_req <= 32 else 64


def cute_decode_plan(
    batch: int, q_len: int, heads: int, kv_len: int, page_size: int, *,
    num_splits: int | None = None, config: dict[str, int] | None = None, fp8: bool = False,
) -> dict[str, int]:  # fmt: skip
    """Launch of the CuTe SM90 decode, from shapes only.

    A bf16 cache takes one of two kernels: ``layout="tokens"`` (``cute_decode.py``: KV tokens
    on the MMA M axis, 16, 32 or 64 rows (query token x head pairs) to a CTA, nothing padded)
    up to 32 rows per request, and ``layout="pairs"`` (``cute_seesaw_pairs.py``: 64 rows on M,
    each of two warp groups scoring its own tile of a pair) from 33 on. Padding 16 or 32 rows
    to 64 costs the pairs kernel more than its better tensor-core feed wins back; from 64 rows
    on it is 1.05x / 1.21x faster than a one-tile 64-row seesaw at 64 / 128 heads (H200,
    2026-12-02: docs/mla.md). A page of 64+ tokens must hold whole 64-token tiles; one CTA
    fills an SM (the ring of 72 KiB tiles takes most of its shared memory), which sizes the
    split count.

    An FP8 cache takes the register kernels (``layout="regs"``), which widen each FP8 slot
    straight into the consumers' wgmma operands (f16 products): blocks of 16 or 32 rows
    (``cute_decode_fp8_regs.py``, two consumer groups taking tiles in turn, four slots), and
    of 64 rows above 32 (``cute_decode_fp8_regs64.py``, the groups scoring tiles in turn and
    splitting each tile's values by output dims, three slots), each block reading the cache
    once. Against the earlier FP8 kernels (a 16-bit ring widened in shared memory by
    converter groups, or the pairs kernel behind such a ring; removed in the thirty-ninth
    session, measurements in docs/mla-experiments.md): 0.76x / 0.87x the time at 16 / 32 heads
    (H200), 0.91x / 0.86x at 64 / 128 heads (H100).
    """
    cfg = dict(config or {})
    unknown = sorted(set(cfg) - CUTE_DECODE_KEYS)
    if unknown:
        raise ValueError(f"unknown CuTe MLA decode plan keys {unknown}; "
                         f"known: {sorted(CUTE_DECODE_KEYS)}")  # fmt: skip
    rows_per_req = q_len * heads
    if fp8:
        layout = str(cfg.get("layout", "regs"))
        if layout != "regs":
            raise ValueError(f"layout={layout!r}: an FP8 cache takes the register layout 'regs'")
        rows = int(cfg.get("rows", _default_rows(rows_per_req)))
        if rows not in (16, 32, 64):
            raise ValueError(f"rows={rows}: the FP8 register decode takes 16, 32 or 64 per CTA")
        # four FP8 slots of 40 KiB beside the query and two p^T at 16-32 rows (five at 16 rows:
        # x1.007, three: x1.043, H200); three at 64 rows (two: x1.5, H100)
        fp8_stages = int(cfg.get("fp8_stages", 3 if rows == 64 else 4))
        # query, two p^T, the FP8 slots (640 bytes a token) and their scales
        need = rows * 576 * 2 + 2 * CUTE_TILE * rows * 2 + fp8_stages * CUTE_TILE * (640 + 4)
        if fp8_stages < 2 or need > 224 * 1024:
            raise ValueError(f"FP8 decode: {fp8_stages} FP8 slots at {rows} rows need {need} "
                             "bytes of shared memory (2 or more, within 224 KiB)")  # fmt: skip
        if int(cfg.get("wgs", 2)) != 2 or int(cfg.get("stages", 0)):
            raise ValueError("the FP8 register decode runs two consumer groups and no 16-bit ring")
        wgs, stages = 2, 0
        if not 0 <= int(cfg.get("max_slack", 4)) <= 8:  # P stays within 256 in f16
            raise ValueError(f"max_slack={cfg['max_slack']}: 0 to 8 (log2 units)")
    else:
        layout = str(cfg.get("layout", "tokens" if rows_per_req <= 32 else "pairs"))
        if layout not in ("tokens", "pairs"):
            raise ValueError(f"layout={layout!r}: a bf16 cache takes 'tokens' or 'pairs'")
        if layout == "pairs":
            rows, wgs = 64, 2
        else:
            rows = int(cfg.get("rows", _default_rows(rows_per_req)))
            # two consumer groups at 32 rows measured -0.6 to +3 % against one (H200, within the
            # noise of a run: docs/mla.md); 16 rows over two groups (8 each) does not compile
            wgs = int(cfg.get("wgs", 1 if rows <= 32 else 2))
        stages, fp8_stages = int(cfg.get("stages", 2)), 0
    row_blocks = -(-rows_per_req // rows)
    if page_size >= CUTE_TILE and page_size % CUTE_TILE:
        raise ValueError(f"page_size={page_size}: pages of 64 tokens or more must hold whole tiles")
    # The pairs kernel's tile: 64 tokens. 32 (a ring of two pairs, so a pair's loads go out a
    # pair ahead, with O rescaled only where a row's max moved) was the default for one
    # 64-row block per request from the sixteenth session, when it led by 1.3 % on average
    # at 64 heads; four later H200 runs (3-7 rounds each, three machines) put 64-token tiles
    # ahead by 2.0-4.6 %, so over all readings the two are within 1 % and the simpler rule
    # wins (docs/mla-experiments.md). With more rows the second row block's loads hit L2, the
    # consumer sets the pace, and 32-token products cost 7 %.
    tile = int(cfg.get("tile", CUTE_TILE))
    if tile not in (32, CUTE_TILE) or (tile != CUTE_TILE and layout != "pairs"):
        raise ValueError(f"tile={tile}: the pairs layout takes 32 or 64 tokens, others 64")
    page_block = min(page_size, tile)
    splits = num_splits or cfg.get("num_splits")
    if not splits:  # one CTA per SM: the ring of 72 KiB tiles takes most of shared memory
        splits = decode_num_splits(batch, row_blocks, kv_len, block_h=64)
    splits = max(1, min(int(splits), max(1, -(-kv_len // CUTE_TILE))))
    workspace = batch * rows_per_req * splits * (512 + 1) * 4 if splits > 1 else 0
    return {
        "layout": layout,
        "rows": rows,
        "wgs": wgs,
        "row_blocks": row_blocks,
        "page_block": page_block,
        "tile": tile,
        # the pairs kernel skips rescaling a thread's O when its rows kept their max (faster
        # with 32-token tiles; not with 64)
        "lazy_rescale": int(cfg.get("lazy_rescale", tile == 32)) if layout == "pairs" else 0,
        # the pairs kernel's rope blocks (only the scores read them) released once scored, so
        # the next pair's load a pair ahead: with two or more row blocks per request (their
        # second block's loads hit L2, and the time a tile holds its stage sets the pace) 1.3 %
        # faster (median of five paired readings on two H200s, four faster, one 0.8 % slower),
        # with one 0.1-1.5 % slower (DRAM sets the pace; docs/mla-experiments.md)
        "rope_early": int(cfg.get("rope_early", row_blocks > 1)) if layout == "pairs" else 0,
        # the FP8 register kernel keeps a row's running max while no score of a tile exceeds
        # it by more than this (log2 units; P then up to 2^slack in f16), which one barrier
        # vote tells the group, and the exchange of the tile's maxima and the output's
        # rescale are skipped; 0: both on every tile. 4: x0.979 / x0.966 the time of 0 at 16 /
        # 32 heads (H100, interleaved replays, thirty-third session; 8 read the same)
        "max_slack": int(cfg.get("max_slack", 4)) if fp8 else 0,
        "stages": stages,
        # KV tiles loaded with the L2 evict-first hint (cute_decode.KvRingProducer): 0.3-2.5 %
        # faster at 11 of 12 shapes over two H200 runs (docs/mla-experiments.md); 0 turns it off
        "evict_first": int(cfg.get("evict_first", 1)),
        # the loader reads the next tile's block-table entries before waiting for a free
        # stage or slot (cute_decode.KvRingProducer); 0: after, on every tile's load latency
        # (x0.99 at 16, 64 and 128 heads for the register kernels on an H100, x1.00 at 32)
        "page_prefetch": int(cfg.get("page_prefetch", 1)),
        "fp8_stages": fp8_stages,
        "num_splits": splits,
        "workspace_bytes": workspace,
    }


# -- prefill ---------------------------------------------------------------------------------

# Named prefill launches the benchmark times side by side (H200, 2026-12-01, causal, 128
# heads, 192/128: docs/mla.md). "l2_s3" was the untuned default; "tma" measured fastest
# (0.77x cuDNN at 8k, 0.82x at 32k); "m64" runs two 64-row CTAs per SM (0.69x).
PREFILL_VARIANTS: dict[str, Config] = {
    "l2_s3": {"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 3, "tma": 0},
    "tma": {"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 3, "tma": 1},
    "m64": {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 2, "tma": 0},
    "m64_tma": {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 2, "tma": 1},
}  # fmt: skip


def prefill_default_config(traits: Traits) -> Config:
    """128 query rows x 64 keys, 8 warps (two warpgroups of 64 rows), 3 stages (2 stages
    compile to ``cp.async.wait_group 0``: no load in flight across an iteration), TMA loads
    for the unmasked tiles (fastest on the H200); 64-row tiles for short prefills."""
    small = int(traits.get("num_tokens", 1 << 20)) < 128
    if small:
        return {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 3, "tma": 0}
    return dict(PREFILL_VARIANTS["tma"])


def sdpa_prefill_default_config(traits: Traits) -> Config:
    """Repeat K/V heads for GQA: every SDPA backend accepts it (``enable_gqa`` is not
    supported by all of them, and MLA prefill has ``Hk == H`` anyway)."""
    return {"gqa": "expand"}


def sdpa_prefill_config_space(traits: Traits) -> list[Config]:
    """GQA by repeating K/V heads or SDPA's native ``enable_gqa``."""
    return _grid(gqa=["expand", "native"])


def prefill_config_space(traits: Traits) -> list[Config]:
    """Query/key tiles, warps, stages and TMA loads for tuning."""
    return _grid(
        block_m=[64, 128], block_n=[32, 64, 128], num_warps=[4, 8], num_stages=[2, 3],
        tma=[0, 1],
    )  # fmt: skip


# -- K/V pack and store ----------------------------------------------------------------------


def pack_default_config(traits: Traits) -> Config:
    """A few tokens per program, enough warps to cover a 576-wide row."""
    return {"block_t": 4, "num_warps": 4}


def pack_config_space(traits: Traits) -> list[Config]:
    """Tokens per program and warps."""
    return _grid(block_t=[1, 2, 4, 8, 16], num_warps=[1, 2, 4, 8])
