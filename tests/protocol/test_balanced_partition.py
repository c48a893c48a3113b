"""balanced_partition: coverage, equal sizes, balance quality and error messages."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.protocol import balanced_partition, partition_spread
from hybridflow.protocol.partition import _contiguous, _differencing


def part_sums(parts: list[list[int]], seqlens: list[int]) -> list[int]:
    return [sum(seqlens[i] for i in part) for part in parts]


@st.composite
def lengths_and_k(draw, equal_size: bool):
    k = draw(st.integers(1, 8))
    count = draw(st.integers(0, 12)) * k if equal_size else draw(st.integers(0, 60))
    return draw(st.lists(st.integers(0, 5000), min_size=count, max_size=count)), k


@settings(max_examples=80, deadline=None)
@given(case=st.one_of(lengths_and_k(True).map(lambda c: (*c, True)), lengths_and_k(False).map(lambda c: (*c, False))))
def test_every_index_exactly_once_and_spread_bounded(case):
    seqlens, k, equal_size = case
    parts = balanced_partition(seqlens, k, equal_size=equal_size)
    assert len(parts) == k
    assert sorted(i for part in parts for i in part) == list(range(len(seqlens)))
    assert all(part == sorted(part) for part in parts)
    if equal_size:
        assert {len(part) for part in parts} == {len(seqlens) // k}
    if seqlens:
        # Differencing never leaves a spread larger than the longest single sample.
        assert partition_spread(parts, seqlens) <= max(seqlens)
        assert max(part_sums(parts, seqlens)) <= max(part_sums(_contiguous(len(seqlens), k), seqlens))


@pytest.mark.parametrize("equal_size", [True, False])
def test_much_better_than_contiguous_on_random_inputs(equal_size):
    rng = np.random.default_rng(1234)
    ours, naive = [], []
    for _ in range(40):
        k = int(rng.integers(2, 9))
        seqlens = rng.integers(16, 4096, size=k * int(rng.integers(4, 33))).tolist()
        parts = balanced_partition(seqlens, k, equal_size=equal_size)
        ours.append(partition_spread(parts, seqlens))
        naive.append(partition_spread(_contiguous(len(seqlens), k), seqlens))
        assert ours[-1] <= naive[-1]
    # The differencing itself does the work, not the fallback to the naive split.
    assert sum(ours) * 10 < sum(naive)


@settings(max_examples=40, deadline=None)
@given(seqlens=st.lists(st.integers(1, 100), min_size=1, max_size=7), k=st.integers(2, 3))
def test_unconstrained_within_the_differencing_bound_of_the_optimum(seqlens, k):
    best = min(max(sum(x for x, p in zip(seqlens, assign) if p == part) for part in range(k))
               for assign in itertools.product(range(k), repeat=len(seqlens)))
    ours = max(part_sums(balanced_partition(seqlens, k, equal_size=False), seqlens))
    assert ours <= (4 / 3 - 1 / (3 * k)) * best + 1e-9


def test_hand_cases():
    # Equal size: the two long samples must land in different parts, each with a short one.
    parts = balanced_partition([10, 9, 1, 2], 2, equal_size=True)
    assert sorted(map(sorted, parts)) == [[0, 2], [1, 3]]
    # The textbook differencing example: 8,7 -> 1; 6,5 -> 1; 4,1 -> 3; 3,1 -> 2.
    # Differencing ends with a spread of 2 (the optimum, 15/15, is not found).
    seqlens = [8, 7, 6, 5, 4]
    assert partition_spread(_differencing(seqlens, 2, equal_size=False), seqlens) == 2
    assert sorted(part_sums(balanced_partition(seqlens, 2, equal_size=False), seqlens)) == [14, 16]
    # Three parts, a perfect split exists and is found.
    parts = balanced_partition([6, 5, 4, 3, 2, 1], 3, equal_size=True)
    assert part_sums(parts, [6, 5, 4, 3, 2, 1]) == [7, 7, 7]


def test_naive_split_wins_when_it_is_better():
    # Differencing leaves a spread of 2 here, the given order happens to split perfectly.
    seqlens = [2, 2, 2, 3, 3]
    assert partition_spread(_differencing(seqlens, 2, equal_size=False), seqlens) == 2
    assert balanced_partition(seqlens, 2, equal_size=False) == [[0, 1, 2], [3, 4]]


def test_more_parts_than_samples_and_empty_input():
    parts = balanced_partition([5, 3], 4, equal_size=False)
    assert sorted(len(p) for p in parts) == [0, 0, 1, 1]
    assert balanced_partition([], 3) == [[], [], []]


@pytest.mark.parametrize("seqlens, k, equal_size, message", [
    ([1, 2, 3], 2, True, "divisible"),
    ([1, 2], 0, True, "positive integer"),
    ([1, -2], 1, False, "non-negative"),
    ([1.5, 2], 1, False, "integer lengths"),
])
def test_errors(seqlens, k, equal_size, message):
    with pytest.raises(ValueError, match=message):
        balanced_partition(seqlens, k, equal_size=equal_size)
