"""The order ``time_gpu_interleaved`` runs its calls in: no call may always run first or
always follow the same neighbour, or a clock ramp or a neighbour's cache footprint would land
on one variant only."""

from __future__ import annotations

import collections
import itertools

import pytest

from tokenspeed.kernels.timing import interleave_order


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_each_replay_runs_every_call_once(n):
    for replay in range(4 * n):
        assert sorted(interleave_order(replay, n)) == list(range(n))


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_over_2n_replays_every_call_takes_every_position(n):
    orders = [interleave_order(r, n) for r in range(2 * n)]
    for call, position in itertools.product(range(n), range(n)):
        assert sum(order[position] == call for order in orders) == 2


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_over_2n_replays_every_call_follows_every_other_twice(n):
    """A Williams design: with rotation alone, call 2 would never follow call 0 (n = 4)."""
    follows = collections.Counter()
    for r in range(2 * n):
        order = interleave_order(r, n)
        follows.update(zip(order, order[1:], strict=False))
    assert follows == {(a, b): 2 for a in range(n) for b in range(n) if a != b}


def test_nothing_to_order_is_an_error():
    with pytest.raises(ValueError, match="nothing"):
        interleave_order(0, 0)
