"""The register-widening FP8 decode's load plan, rebuilt thread by thread on the CPU: every
A operand register must hold the cache value its (row, column) slot stands for, and every
shared-memory run must be read by exactly one thread."""

from __future__ import annotations

import numpy as np

from tokenspeed.mla import fp8_regs_layout as lay

WARPS, LANES = 4, 32
SEL = {lay.PAIR_LOW: (0, 4, 1, 5), lay.PAIR_HIGH: (2, 6, 3, 7)}  # prmt's byte sources


def _prmt(a: list, b: list, selector: int) -> list:
    both = a + b
    return [both[i] for i in SEL[selector]]


def _value_regs(runs: list[list]) -> dict[int, list]:
    """A thread's values operand registers as the kernel fills them from its four runs (of
    ``(token, dim)`` bytes): each 4-byte word of two tokens' runs paired by the byte
    permutes, each half widened into register ``value_word``."""
    regs = {}
    for u in range(len(runs[0]) // 4):
        for second_pair in (0, 1):
            a, b = runs[2 * second_pair], runs[2 * second_pair + 1]
            for high_pair, sel in ((0, lay.PAIR_LOW), (1, lay.PAIR_HIGH)):
                word = _prmt(a[4 * u : 4 * u + 4], b[4 * u : 4 * u + 4], sel)
                for high in (0, 1):
                    regs[lay.value_word(u, second_pair, high_pair, high)] = word[
                        2 * high : 2 * high + 2
                    ]
    return regs


def test_query_order_is_a_permutation_of_word_pairs():
    starts = [lay.query_element(p) for p in range(288)]
    assert sorted(starts) == list(range(0, 576, 2))


def test_tile_token_is_an_involution():
    assert sorted(lay.tile_token(m) for m in range(64)) == list(range(64))
    assert all(lay.tile_token(lay.tile_token(m)) == m for m in range(64))


def test_scores_operand_holds_the_permuted_product():
    """A[m, k] must be the cache value of token tile_token(m) at the dim the query's k-th
    value came from, so that sum_k A[m, k] * Qperm[h, k] is token m's score."""
    dim_of = np.empty(576, dtype=int)  # K position -> cache dim
    for p in range(288):
        dim_of[lay.query_element(p)] = 2 * p
        dim_of[lay.query_element(p) + 1] = 2 * p + 1
    seen = np.zeros((64, 576), dtype=int)
    for w in range(WARPS):
        for lane in range(LANES):
            for g in range(9):
                t0, t1, d0 = lay.score_load(w, lane, g)
                runs = [[(t, d0 + i) for i in range(16)] for t in (t0, t1)]
                for t, d in runs[0] + runs[1]:
                    seen[t, d] += 1
                regs = {}
                for j in range(4):
                    for second in (0, 1):
                        word = runs[second][4 * j : 4 * j + 4]
                        for high in (0, 1):
                            regs[lay.score_word(j, second, high)] = word[2 * high : 2 * high + 2]
                assert sorted(regs) == list(range(16))
                for j in range(4):  # k-block 4 g + j of the 36
                    for e in range(8):
                        m, k = lay.a_slot(w, lane, e)
                        token, dim = regs[4 * j + e // 2][e % 2]
                        assert token == lay.tile_token(m)
                        assert dim == dim_of[g * 64 + j * 16 + k]
    assert (seen == 1).all()


def test_values_operand_holds_the_transposed_cache():
    """A[d, kappa] of o^T = V^T p^T must be the cache value of token tile_token(kappa) at
    dim value_dim(d); value_dim must cover the 512 latent dims once."""
    assert sorted(lay.value_dim(d) for d in range(512)) == list(range(512))
    seen = np.zeros((64, 512), dtype=int)
    for w in range(WARPS):
        for lane in range(LANES):
            for c in range(4):
                tokens, d0 = lay.value_load(w, lane, c)
                runs = [[(t, d0 + i) for i in range(16)] for t in tokens]
                for run in runs:
                    for t, d in run:
                        seen[t, d] += 1
                regs = _value_regs(runs)
                assert sorted(regs) == list(range(32))
                for i in range(8):  # M tile i of o^T's 512 rows
                    for e in range(8):
                        m, k = lay.a_slot(w, lane, e)
                        token, dim = regs[4 * i + e // 2][e % 2]
                        assert token == lay.tile_token(16 * c + k)
                        assert dim == lay.value_dim(64 * i + m)
    assert (seen == 1).all()


def test_values_halves_hold_the_transposed_cache():
    """The 64-row kernel's groups each hold half of o^T (256 rows, four M tiles): group
    ``h``'s A[d, kappa] must be the cache value of token tile_token(kappa) at dim
    value_dim(256 h + d), from 8-byte runs; the two halves read every byte once."""
    seen = np.zeros((64, 512), dtype=int)
    for half in (0, 1):
        for w in range(WARPS):
            for lane in range(LANES):
                for c in range(4):
                    tokens, d0 = lay.value_load_half(w, lane, c, half)
                    runs = [[(t, d0 + i) for i in range(8)] for t in tokens]
                    for run in runs:
                        for t, d in run:
                            seen[t, d] += 1
                    regs = _value_regs(runs)
                    assert sorted(regs) == list(range(16))
                    for i in range(4):  # M tile i of the group's 256 rows
                        for e in range(8):
                            m, k = lay.a_slot(w, lane, e)
                            token, dim = regs[4 * i + e // 2][e % 2]
                            assert token == lay.tile_token(16 * c + k)
                            assert dim == lay.value_dim(256 * half + 64 * i + m)
    assert (seen == 1).all()


def test_hoisted_offsets_equal_slot_offset():
    """The kernels address runs by ``score_offset`` / ``value_offset`` (few live bases plus
    constants); they must name the same bytes as ``slot_offset`` of the runs' token and dim."""
    for w in range(WARPS):
        for lane in range(LANES):
            for g in range(9):
                t0, t1, d0 = lay.score_load(w, lane, g)
                assert lay.score_offset(w, lane, g, 0) == lay.slot_offset(t0, d0)
                assert lay.score_offset(w, lane, g, 1) == lay.slot_offset(t1, d0)
            for c in range(4):
                for half in (0, 1):
                    tokens, d0 = lay.value_load_half(w, lane, c, half)
                    for s in range(4):
                        want = lay.slot_offset(tokens[s], d0)
                        assert lay.value_offset(w, lane, c, s, half) == want


def _bank_ways(addresses: list[int]) -> int:
    """Wavefronts one 16-byte-per-lane shared load of 8 lanes needs beyond the first + 1."""
    chunks: dict[int, set[int]] = {}
    for a in addresses:
        chunks.setdefault((a % 128) // 16, set()).add(a // 16)
    return max(len(v) for v in chunks.values())


def test_slot_offset_is_a_bijection_onto_the_slot():
    """Every (token, dim) byte has its own place in the slot's 64 x 640 bytes."""
    places = {lay.slot_offset(t, d) for t in range(64) for d in range(576)}
    assert len(places) == 64 * 576
    assert min(places) >= 0 and max(places) < lay.SLOT_BYTES


def test_shared_loads_are_conflict_free():
    """The slot's 128-byte swizzle and the tiles' token order: each 8-lane phase of a
    16-byte load covers the 32 banks once, for the scores' loads (two tokens whose rows
    differ in bit 2, so their chunks fall in opposite halves of the row) and the values'
    (four tokens distinct in bits 1-2). With 576-byte rows the values' loads conflicted 2-way."""
    for w in range(WARPS):
        for phase in range(4):
            lanes = range(8 * phase, 8 * phase + 8)
            for g in range(9):
                for second in (0, 1):
                    addr = [lay.slot_offset(lay.score_load(w, ln, g)[second],
                                            lay.score_load(w, ln, g)[2]) for ln in lanes]  # fmt: skip
                    assert _bank_ways(addr) == 1
            for c in range(4):
                for s in range(4):
                    addr = [lay.slot_offset(lay.value_load(w, ln, c)[0][s],
                                            lay.value_load(w, ln, c)[1]) for ln in lanes]  # fmt: skip
                    assert _bank_ways(addr) == 1


def test_the_old_token_order_would_conflict():
    """The token order matters (the test above is not vacuous): with bit 0 flipped where
    bit 1 is set (the order for 576-byte rows), the scores' first phase conflicts 2-way in
    the swizzled slot."""
    old = lambda m: m ^ ((m >> 1) & 1)  # noqa: E731
    addr = [lay.slot_offset(old(ln // 4), 16 * (ln % 4)) for ln in range(8)]
    assert _bank_ways(addr) == 2
