"""Where the register-widening FP8 decode (``cute_decode_fp8_regs.py``) reads each value.

That kernel widens the e4m3 cache straight into the A operands of its two wgmmas (``s^T = K
q^T`` and ``o^T = V^T p^T``, A from registers), with no widened copy in shared memory. A
register A operand of an m64 x k16 wgmma gives each thread fixed (row, column) slots: in warp
``w`` of the group, lane ``l`` holds rows ``16 w + l // 4`` and ``+ 8``, columns ``2 (l % 4)``,
``+ 1``, ``+ 8`` and ``+ 9`` (``a_slot``). Both products are free to permute their K axis
(the scores' 576 dims, with the query permuted the same way; the values' 64 tokens, with
``p^T`` in the same order) and their M axis (the tokens of ``s^T``; the 512 dims of ``o^T``,
undone where the output is stored), so the permutations below make every thread's share of
a tile a few 16-byte runs of shared memory:

* scores: a thread loads 16 consecutive dims of each of its two tokens per 64-dim group
  (``score_load``); the four words of each run are the four k-blocks' pairs of columns
  (``query_element``: where the query's dims go so that they meet the right cache dims).
* values: a thread owns 16 consecutive dims of the output (``value_dim``) and loads them for
  each of its four tokens per k-block of 16 tokens (``value_load``); a byte permute pairs two
  tokens' bytes of one dim, the pair a column pair of the A operand.
* the tile's tokens go through ``tile_token`` (bit 2 flipped where bit 0 is set), and a slot
  stores them as the TMA's 128-byte-wide boxes with the 128-byte swizzle (``slot_offset``):
  the two tokens one 8-lane phase of the scores' loads reads then put their runs in opposite
  halves of the banks, and the four of the values' loads in four distinct quarters, so both
  are conflict-free (with the page block's rows 576 bytes apart the values' loads conflicted
  2-way).

Pure integer functions of plain ``int`` (or DSL integers): the kernel and the CPU test
(``tests/unit/mla/test_fp8_regs_layout.py``, which rebuilds both A operands thread by thread
and compares them with the matrices they stand for) use the same ones.
"""

from __future__ import annotations

from typing import Any

GROUP = 64  # dims of the scores per group of four k-blocks (a thread's 16-byte run each)
DIMS_PER_WARP = 128  # of the 512 value dims, per warp of the group


def a_slot(warp: Any, lane: Any, e: int) -> tuple[Any, Any]:
    """The (row, column) in an m64 x k16 A operand of element ``e`` (0-7) of a thread's
    registers, in the order CuTe lists them: column pair, row half, 8-column block."""
    row = 16 * warp + lane // 4 + 8 * ((e // 2) % 2)
    col = 2 * (lane % 4) + e % 2 + 8 * (e // 4)
    return row, col


SLOT_COLS = 640  # a slot's bytes per token: five 128-byte column blocks (the last half empty)
SLOT_BYTES = 64 * SLOT_COLS


def tile_token(m: Any) -> Any:
    """The tile's token (0-63) at position ``m`` of both products' token axis: bit 2
    flipped where bit 0 is set (an involution)."""
    return m ^ ((m & 1) << 2)


def slot_offset(token: Any, dim: Any) -> Any:
    """Where byte ``dim`` of ``token`` sits in a slot: the TMA's 128-byte-wide boxes with the
    128-byte swizzle, one column block of 64 rows after another; within a row, 16-byte chunk
    ``c`` is stored at ``c ^ (token % 8)``."""
    block = dim // 128
    chunk = ((dim % 128) // 16) ^ (token % 8)
    return block * (64 * 128) + token * 128 + chunk * 16 + dim % 16


BLOCK_BYTES = 64 * 128  # one 128-byte column block of a slot's 64 tokens
VALUE_BLOCK_TOKENS_BYTES = 16 * 128  # a values k-block's 16 tokens within a column block


def score_offset(warp: Any, lane: Any, g: int, second: int) -> Any:
    """``slot_offset`` of ``score_load``'s run of its first or ``second`` token in group
    ``g``, written as one of two per-token bases (even or odd ``g``) plus a constant, so that
    the kernel keeps four addresses live across the nine groups instead of eighteen."""
    token = tile_token(16 * warp + lane // 4 + 8 * second)
    chunk = ((lane % 4) ^ (token % 8)) ^ (4 * (g % 2))
    return (g // 2) * BLOCK_BYTES + (token * 128 + chunk * 16)


def value_offset(warp: Any, lane: Any, c: int, s: int, half: Any = 0) -> Any:
    """``slot_offset`` of ``value_load``'s run ``s`` of k-block ``c`` (from byte ``8 half``
    of the run, as ``value_load_half``): a per-run base plus a constant for ``c``, four
    addresses live across the tile's k-blocks."""
    first = tile_token(2 * (lane % 4) + (0, 1, 8, 9)[s])  # the token within its k-block
    base = warp * BLOCK_BYTES + first * 128 + ((lane // 4) ^ (first % 8)) * 16 + 8 * half
    return c * VALUE_BLOCK_TOKENS_BYTES + base


def query_element(p: Any) -> Any:
    """Where the scores' K order puts the query's 32-bit word ``p`` (dims ``2p``, ``2p + 1``,
    0-287): the position of its first value (the second follows it)."""
    g = p // 32
    q = (p % 32) // 8
    j = (p % 8) // 2
    return g * GROUP + j * 16 + 2 * q + 8 * (p % 2)


def score_load(warp: Any, lane: Any, g: int) -> tuple[Any, Any, Any]:
    """A thread's two 16-byte runs of group ``g``: (first token, second token, first dim)."""
    m = 16 * warp + lane // 4
    return tile_token(m), tile_token(m + 8), g * GROUP + 16 * (lane % 4)


def score_word(j: int, second_token: int, high: int) -> int:
    """The A operand's 32-bit register (0-15, four k-blocks of four) that widens half ``high``
    of word ``j`` of a thread's run of its first or ``second_token``."""
    return second_token + 2 * high + 4 * j


def value_dim(d: Any) -> Any:
    """The latent dim at row ``d`` (0-511) of ``o^T``."""
    i = d // 64
    within = d % 64
    warp = within // 16
    half = (within % 16) // 8
    return warp * DIMS_PER_WARP + (within % 8) * 16 + 2 * i + half


def value_load(warp: Any, lane: Any, c: int) -> tuple[list[Any], Any]:
    """A thread's four 16-byte runs of k-block ``c`` (tokens ``16 c`` to ``16 c + 15``): the
    tokens, in the order of columns ``2 (l % 4)``, ``+ 1``, ``+ 8``, ``+ 9``, and the first dim."""
    first = 16 * c + 2 * (lane % 4)
    tokens = [tile_token(first + k) for k in (0, 1, 8, 9)]
    return tokens, warp * DIMS_PER_WARP + (lane // 4) * 16


def value_load_half(warp: Any, lane: Any, c: int, half: Any) -> tuple[list[Any], Any]:
    """The 64-row kernel's share of ``value_load``: each consumer group takes half of the
    output, o^T's M tiles ``4 half`` to ``4 half + 3`` (rows ``256 half`` on), whose dims are
    bytes ``8 half`` to ``8 half + 7`` of each 16-byte run, so a thread loads four 8-byte runs
    per k-block; their words are ``value_word``'s 0-1, the operand's registers 0-15. In a
    half warp, two of the 16 runs share banks (the same wavefronts as the 16-byte loads)."""
    tokens, d0 = value_load(warp, lane, c)
    return tokens, d0 + 8 * half


# byte permutes that pair word u of two tokens' runs: dims 4u, 4u + 1 (low) or 4u + 2, 4u + 3
PAIR_LOW = 0x5140
PAIR_HIGH = 0x7362


def value_word(u: int, second_pair: int, high_pair: int, high: int) -> int:
    """The A operand's 32-bit register (0-31: eight M tiles of four) that widens half ``high``
    of the ``PAIR_HIGH`` (or ``PAIR_LOW``) permute of word ``u`` of the first (or second) pair
    of a thread's tokens."""
    delta = 2 * high_pair + high  # dim 4u + delta of the run
    return delta % 2 + 2 * second_pair + 4 * (2 * u + delta // 2)
