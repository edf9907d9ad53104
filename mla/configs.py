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
    # SMEM: q tile (BLOCK_H x 576 x 2 B) + stages x BLOCK_N x 576 x 2 B. 32-token tiles keep
    # 64-row blocks at ~150 KiB (one CTA/SM) and 16/32-row blocks under ~110 KiB (two).
    return {
        "block_h": block_h,
        "block_n": 32 if big else 16,
        "num_warps": 8 if (block_h >= 32 and big) else 4,
        "num_stages": 3 if block_h >= 64 else 2,  # measured on H200: 3 stages -8% at 64 rows
        "q_reload": 0,
        "num_splits": decode_num_splits(
            int(traits["batch"]), row_blocks, int(traits["kv_len"]), block_h
        ),
    }


def decode_config_space(traits: Traits) -> list[Config]:
    """What tuning tries: row blocks, KV tile, warps, pipeline depth, split counts."""
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
        )
        if not (c["block_h"] == 64 and c["block_n"] == 64 and c["num_stages"] > 2)
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
    cfg = dict(decode_default_config(traits))
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
        "rows_per_group": rows,
        "blocks_per_group": per_group,
        "row_blocks": row_blocks,
        "num_splits": splits,
        "workspace_bytes": decode_workspace_bytes(batch, q_len, heads, splits, kv_lora_rank),
    }


CUTE_TILE = 64  # KV tokens per tile of the CuTe decode
FP8_PAIRS_TILE = 32  # ... and of the FP8 pairs decode, whose ring holds one pair of them


def cute_decode_plan(
    batch: int, q_len: int, heads: int, kv_len: int, page_size: int, *,
    num_splits: int | None = None, config: dict[str, int] | None = None, fp8: bool = False,
) -> dict[str, int]:  # fmt: skip
    """Launch of the CuTe SM90 decode, from shapes only.

    Three kernels: ``layout="tokens"`` (``cute_decode.py``: KV tokens on the MMA M axis, 16,
    32 or 64 rows (query token x head pairs) to a CTA, nothing padded), ``layout="pairs"``
    (``cute_seesaw_pairs.py``: 64 rows on M, each of two warp groups scoring its own tile of a
    pair) and ``layout="heads"`` (``cute_seesaw.py``: 64 rows on M, the groups taking turns on
    one tile's softmax). Up to 32 rows per request the tokens layout is faster (padding 16 or
    32 rows to 64 costs the other two more than their better tensor-core feed wins back);
    from 64 rows on the pairs layout is: 1.05x the heads layout at 64 heads and 1.21x at 128
    (H200, 2026-12-02: docs/mla.md). A page of 64+ tokens must hold whole 64-token tiles;
    one CTA fills an SM (the ring of 72 KiB tiles takes most of its shared memory), which
    sizes the split count.

    An FP8 cache (``fp8``) takes, up to 32 rows per request, the register layout
    (``layout="regs"``, ``cute_decode_fp8_regs.py``) in blocks of 16 or 32 rows: ``fp8_stages``
    FP8 slots widened by two consumer warp groups straight into their wgmma operands (H200:
    94 / 127 us at 16 / 32 heads against 119 / 141 us for the tokens layout). The tokens layout
    (``cute_decode_fp8.py``) stays on request: ``stages`` 16-bit tiles fed by ``fp8_stages``
    FP8 slots, converted by ``converter_wgs`` warp groups. More than 32 rows take the
    register layout in blocks of 64, each reading the cache once (``rows=64``,
    ``cute_decode_fp8_regs64.py``: the groups score tiles in turns and split each tile's
    values by output dims; H100: 181 / 339 us at 64 / 128 heads against 199 / 394 us for the
    pairs layout, 0.86-0.92x at 48 to 128 rows). The pairs layout
    (``cute_seesaw_pairs_fp8.py``, on request) widens one pair of 32-token bf16 stages from
    ``fp8_stages`` 32-token FP8 slots in the producer warp group's threads, with
    ``widener_regs`` registers each (H200: 222 / 428 us at 64 / 128 heads against 298 / 586
    us for blocks of 32 rows on the tokens layout, ``layout="tokens"``). The tokens layout's
    default ring, 2 + 1 with two converter groups, was the fastest of five on the H200
    (2026-12-02, docs/mla.md), e.g. 139-145 us at 16 heads against 184-199 us for one converter group and 157-160 us for one
    bf16 tile fed by two or three FP8 slots; with the exact widening of the same day, 142.4
    us against 156.5 us for one converter group.
    """
    cfg = dict(config or {})
    rows_per_req = q_len * heads
    if fp8:
        # more than 32 rows: one CTA per 64 rows, each reading the cache once (1.33-1.36x
        # faster at 64 and 128 heads than blocks of 32 rows that each read it, H200)
        if "layout" not in cfg and rows_per_req > 32:
            # blocks of 64 rows on the 64-row register kernel (cute_decode_fp8_regs64.py):
            # with its loads addressed from few bases, x0.912 the pairs kernel's time at 64
            # heads and x0.86 at 128 (H100, interleaved replays, thirty-sixth session)
            cfg = {"layout": "regs", "rows": 64, **cfg}
        fp8_layout = cfg.get("layout", "regs")
        if fp8_layout == "pairs":
            # a 16-bit ring of one pair of 32-token tiles fed by two 32-token FP8 slots; the
            # producer warp group widens with 72 registers a thread (the consumers keep 216),
            # into f16 (one conversion per pair of values: 10-11 % faster than bf16, H200)
            if int(cfg.get("tile", FP8_PAIRS_TILE)) != FP8_PAIRS_TILE:
                raise ValueError("the FP8 pairs decode takes 32-token tiles")
            if int(cfg.get("rope_early", 0)):
                raise ValueError(
                    "the FP8 pairs decode releases each tile's rope dims with its hi half"
                )
            cfg = {"stages": 2, "fp8_stages": 2, "converter_wgs": 1, "tile": FP8_PAIRS_TILE,
                   "rope_early": 0, "widener_regs": 72, "mma_dtype": "f16", **cfg}  # fmt: skip
            if int(cfg["stages"]) != 2:
                raise ValueError("the FP8 pairs decode's 16-bit ring is one pair: stages=2")
            if int(cfg["widener_regs"]) not in (40, 56, 72):
                raise ValueError(f"widener_regs={cfg['widener_regs']}: 40, 56 or 72")
        elif fp8_layout == "regs":
            # up to 32 rows, widened in the consumers' registers (cute_decode_fp8_regs.py):
            # two consumer groups taking turns on tiles, four FP8 slots of 40 KiB (swizzled
            # 128-byte TMA boxes) in the shared memory the query and p^T leave; 0.76x /
            # 0.87x the tokens kernel's time at 16 / 32 heads with per-token scales, 0.75x /
            # 0.86x per-tensor (H200); five slots at 16 rows: x1.007, three: x1.043. 64 rows
            # (cute_decode_fp8_regs64.py: the groups take turns scoring and share every
            # tile's values by output dims; three slots fit), the default above 32 rows
            if int(cfg.get("rows", 32)) not in (16, 32, 64):
                raise ValueError(
                    f"rows={cfg['rows']}: the FP8 register decode takes 16, 32 or 64 per CTA"
                )
            rows_regs = int(cfg.get("rows", 16 if rows_per_req <= 16 else 32))
            cfg = {"stages": 0, "fp8_stages": 3 if rows_regs == 64 else 4, "converter_wgs": 0,
                   "wgs": 2, "rows": rows_regs, "mma_dtype": "f16", "layout": "regs",
                   **cfg}  # fmt: skip
            if cfg["mma_dtype"] != "f16" or int(cfg["stages"]) or int(cfg["fp8_stages"]) < 2:
                raise ValueError("the FP8 register decode multiplies in f16, from 2+ FP8 slots")
            if not 0 <= int(cfg.get("max_slack", 0)) <= 8:  # P stays within 256 in f16
                raise ValueError(f"max_slack={cfg['max_slack']}: 0 to 8 (log2 units)")
        elif fp8_layout != "tokens":
            raise ValueError(
                f"layout={fp8_layout!r}: the FP8 CuTe decode takes 'tokens', 'pairs' or 'regs'"
            )
        else:
            if int(cfg.get("rows", 32)) not in (16, 32):
                raise ValueError(f"rows={cfg['rows']}: the FP8 CuTe decode takes 16 or 32 per CTA")
            # more rows than 32 run in blocks of 32, each CTA reading its split of the cache;
            # f16 products (one conversion per pair of values): 8-10 % faster than bf16 (H200)
            cfg = {"stages": 2, "fp8_stages": 1, "converter_wgs": 2, "wgs": 1,
                   "layout": "tokens", "rows": 16 if rows_per_req <= 16 else 32,
                   "mma_dtype": "f16", **cfg}  # fmt: skip
        if cfg["mma_dtype"] not in ("bf16", "f16"):
            raise ValueError(f"mma_dtype={cfg['mma_dtype']!r}: 'bf16' or 'f16'")
    layout = str(cfg.get("layout", "tokens" if rows_per_req <= 32 else "pairs"))
    if layout == "regs" and not fp8:
        raise ValueError("layout='regs' widens an FP8 cache: a bf16 cache takes the others")
    if layout not in ("tokens", "heads", "pairs", "regs"):
        raise ValueError(f"layout={layout!r}: expected 'tokens', 'heads' or 'pairs'")
    if layout in ("heads", "pairs"):
        rows, wgs = 64, 2
    else:
        rows = int(cfg.get("rows", 16 if rows_per_req <= 16 else 32 if rows_per_req <= 32 else 64))
        # two consumer groups at 32 rows measured -0.6 to +3 % against one (H200, within the
        # noise of a run: docs/mla.md); 16 rows over two groups (8 each) does not compile
        wgs = int(cfg.get("wgs", 1 if rows <= 32 or layout == "regs" else 2))
    row_blocks = -(-rows_per_req // rows)
    if page_size >= CUTE_TILE and page_size % CUTE_TILE:
        raise ValueError(f"page_size={page_size}: pages of 64 tokens or more must hold whole tiles")
    # The pairs kernel's tile: 64 tokens. 32 (a ring of two pairs, so a pair's loads go out a
    # pair ahead, with O rescaled only where a row's max moved) was the default for one
    # 64-row block per request from the sixteenth session, when it led by 1.3 % on average
    # at 64 heads; four later H200 runs (3-7 rounds each, three machines) put 64-token tiles
    # ahead by 2.0-4.6 %, so over all readings the two are within 1 % and the simpler rule
    # wins (docs/mla.md). With more rows the second row block's loads hit L2, the consumer
    # sets the pace, and 32-token products cost 7 %.
    tile = int(cfg.get("tile", CUTE_TILE))
    if tile not in (32, CUTE_TILE) or (tile != CUTE_TILE and layout != "pairs"):
        raise ValueError(f"tile={tile}: the pairs layout takes 32 or 64 tokens, others 64")
    page_block = min(page_size, tile)
    splits = num_splits or cfg.get("num_splits")
    if not splits:  # one CTA per SM: the ring of 72 KiB tiles takes most of shared memory
        splits = decode_num_splits(batch, row_blocks, kv_len, block_h=64)
    splits = max(1, min(int(splits), max(1, -(-kv_len // CUTE_TILE))))
    stages = int(cfg.get("stages", 2))
    fp8_stages = int(cfg["fp8_stages"]) if fp8 else 0
    # One CTA per SM taking an equal share of all requests' tiles (cute_decode_persistent.py):
    # bf16, the tokens layout on one consumer group, and no split count asked for. Off by
    # default: correct, but slower than one CTA per request in every H200 run (152 / 162 us
    # against 145 / 148 us at 16 / 32 heads in the latest; its parts' stores stall the ring,
    # docs/mla.md).
    persistent = int(cfg.get("persistent", 0))
    asked = int(num_splits or cfg.get("num_splits") or 1)
    if persistent and (fp8 or layout != "tokens" or wgs != 1 or rows > 32 or asked > 1):
        raise ValueError("persistent=1 takes a bf16 cache, the tokens layout on one consumer "
                         "group (16 or 32 rows) and no split count")  # fmt: skip
    if persistent:
        splits = 1
    ctas = num_sms() if persistent else 0
    workspace = batch * rows_per_req * splits * (512 + 1) * 4 if splits > 1 else 0
    if persistent:  # two part slots per CTA
        workspace = 2 * ctas * rows * (512 + 1) * 4
    if fp8:  # query + bf16 tiles + p + FP8 slots must fit the SM's 227 KiB of shared memory
        need = rows * 576 * 2 + stages * tile * 576 * 2 + CUTE_TILE * rows * 2
        need += fp8_stages * tile * 576
        if layout == "regs":  # query, two p^T, the FP8 slots (640 bytes a token) and scales
            need = rows * 576 * 2 + 2 * CUTE_TILE * rows * 2 + fp8_stages * tile * (640 + 4)
        if (stages < 1 and layout != "regs") or fp8_stages < 1 or need > 224 * 1024:
            raise ValueError(f"FP8 decode: {stages} bf16 tiles + {fp8_stages} FP8 slots at "
                             f"{rows} rows need {need} bytes of shared memory")  # fmt: skip
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
        # with one 0.1-1.5 % slower (DRAM sets the pace; docs/mla.md)
        "rope_early": int(cfg.get("rope_early", row_blocks > 1)) if layout == "pairs" else 0,
        # the FP8 register kernel keeps a row's running max while no score of a tile exceeds
        # it by more than this (log2 units; P then up to 2^slack in f16), which one barrier
        # vote tells the group, and the exchange of the tile's maxima and the output's
        # rescale are skipped; 0: both on every tile. 4: x0.979 / x0.966 the time of 0 at 16 /
        # 32 heads (H100, interleaved replays, thirty-third session; 8 read the same)
        "max_slack": int(cfg.get("max_slack", 4)) if layout == "regs" and fp8 else 0,
        "stages": stages,
        # KV tiles loaded with the L2 evict-first hint (cute_decode.KvRingProducer): 0.3-2.5 %
        # faster at 11 of 12 shapes over two H200 runs (docs/mla.md); 0 turns it off
        "evict_first": int(cfg.get("evict_first", 1)),
        # the producer reads the next tile's block-table entries before waiting for a free
        # stage (cute_decode.KvRingProducer); 0: after, on every tile's load latency. The FP8
        # ring loader reads them just in time (its prefetching build failed a GPU test,
        # docs/mla.md); the register kernels' loader reads them before its slot wait (x0.99
        # at 16, 64 and 128 heads on an H100, x1.00 at 32)
        "page_prefetch": int(cfg.get("page_prefetch", 1)) if layout == "regs" or not fp8 else 0,
        "fp8_stages": fp8_stages,
        "converter_wgs": int(cfg["converter_wgs"]) if fp8 else 0,
        "num_splits": splits,
        "persistent": persistent,
        # the FP8 pairs kernel's widening threads' registers (its consumers get the rest)
        "widener_regs": int(cfg["widener_regs"]) if fp8 and layout == "pairs" else 0,
        # the type the FP8 kernels' products multiply in (a bf16 cache's: bf16)
        "mma_dtype": str(cfg["mma_dtype"]) if fp8 else "bf16",
        "ctas": ctas,
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
