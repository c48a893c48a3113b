"""Split sample indices into k parts whose summed lengths are as equal as possible.

Used to balance work across data-parallel ranks: each sample costs roughly its sequence
length, so we want every rank's total length close to the others'.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from hybridflow.protocol._checks import positive_int

# One subset of a partial partition: [sum of lengths, indices]. Lists (not tuples) so a
# merge can extend the index list in place instead of copying it.
_Subset = list


def balanced_partition(seqlens: Sequence[int], k: int, equal_size: bool = True) -> list[list[int]]:
    """Partition ``range(len(seqlens))`` into ``k`` index lists with near-equal length sums.

    Args:
        seqlens: non-negative cost (e.g. token count) of every sample.
        k: number of parts (e.g. data-parallel ranks), at least 1.
        equal_size: every part gets exactly ``len(seqlens) // k`` samples; then
            ``len(seqlens)`` must be divisible by ``k``.

    Returns:
        ``k`` lists of indices, each sorted ascending; together they cover every index
        exactly once. Parts may be empty when ``equal_size=False`` and ``k > n``.
    """
    lengths, k = _validate(seqlens, k, equal_size)
    if not lengths:
        return [[] for _ in range(k)]
    candidate = _differencing(lengths, k, equal_size)
    naive = _contiguous(len(lengths), k)
    # Compare by the largest part first (it decides when the slowest rank finishes),
    # then by the spread.
    if _score(naive, lengths) < _score(candidate, lengths):
        candidate = naive
    return [sorted(part) for part in candidate]


def partition_spread(parts: Sequence[Sequence[int]], seqlens: Sequence[int]) -> int:
    """Largest minus smallest summed length over the parts (0 is perfectly balanced)."""
    sums = [sum(seqlens[i] for i in part) for part in parts]
    return max(sums) - min(sums)


def _validate(seqlens: Sequence[int], k: int, equal_size: bool) -> tuple[list[int], int]:
    k = positive_int(k, "balanced_partition: k (number of parts)")
    lengths = [int(x) for x in seqlens]
    if any(x != y for x, y in zip(lengths, seqlens)):
        raise ValueError("balanced_partition needs integer lengths (token counts); round them first")
    negative = [i for i, x in enumerate(lengths) if x < 0]
    if negative:
        raise ValueError(
            f"balanced_partition needs non-negative lengths; index {negative[0]} has "
            f"{lengths[negative[0]]}. Pass token counts (e.g. attention_mask.sum(-1))."
        )
    if equal_size and len(lengths) % k != 0:
        raise ValueError(
            f"balanced_partition with equal_size=True needs the number of samples "
            f"({len(lengths)}) to be divisible by k={k}; pad first (DataProto.pad_to_divisor) "
            f"or pass equal_size=False"
        )
    return lengths, k


def _differencing(lengths: list[int], k: int, equal_size: bool) -> list[list[int]]:
    """Karmarkar-Karp k-way differencing; returns k index lists (unsorted).

    A partial partition stores only its subsets that hold items, sorted by sum
    descending; the missing ones are implicit empty subsets of sum 0 at the end. Early
    partial partitions hold one item, so a merge costs O(items held), not O(k).
    """
    # Heap of (-spread, tie-breaker, subsets). The counter makes the order (and so the
    # result) deterministic and keeps heapq from comparing lists.
    heap: list[tuple[int, int, list[_Subset]]] = []
    for counter, group in enumerate(_initial_groups(lengths, k, equal_size)):
        subsets = sorted(([lengths[i], [i]] for i in group), key=lambda s: -s[0])
        heap.append((-_spread(subsets, k), counter, subsets))
    heapq.heapify(heap)
    counter = len(heap)
    while len(heap) > 1:
        _, _, first = heapq.heappop(heap)
        _, _, second = heapq.heappop(heap)
        merged = _merge(first, second, k)
        heapq.heappush(heap, (-_spread(merged, k), counter, merged))
        counter += 1
    parts = [subset[1] for subset in heap[0][2]]
    return parts + [[] for _ in range(k - len(parts))]


def _spread(subsets: list[_Subset], k: int) -> int:
    smallest = subsets[-1][0] if len(subsets) == k else 0  # an implicit empty subset
    return subsets[0][0] - smallest


def _initial_groups(lengths: list[int], k: int, equal_size: bool) -> list[list[int]]:
    if not equal_size:
        return [[i] for i in range(len(lengths))]
    # Sorting before grouping puts items of similar length in one group, so each
    # starting partial partition already has a small spread.
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return [order[start : start + k] for start in range(0, len(order), k)]


def _merge(a: list[_Subset], b: list[_Subset], k: int) -> list[_Subset]:
    """Pair a's heaviest subset with b's lightest, and so on (both sorted descending).

    Slot i of ``a`` meets slot k-1-i of ``b``; only slots where either side holds items
    are visited (the rest would pair two implicit empty subsets).
    """
    if len(a) + len(b) >= k:
        slots: Sequence[int] = range(k)
    else:  # disjoint: a's filled slots come first, b's filled slots meet the last ones
        slots = [*range(len(a)), *range(k - len(b), k)]
    merged = []
    for i in slots:
        left = a[i] if i < len(a) else None
        right = b[k - 1 - i] if k - 1 - i < len(b) else None
        if left is None or right is None:
            merged.append(left or right)
            continue
        # Extend the longer index list with the shorter one: small-to-large keeps the
        # total copying at O(n log n) however lopsided the merge tree gets.
        big, small = (left[1], right[1]) if len(left[1]) >= len(right[1]) else (right[1], left[1])
        big.extend(small)
        merged.append([left[0] + right[0], big])
    merged.sort(key=lambda s: -s[0])
    return merged


def _contiguous(n: int, k: int) -> list[list[int]]:
    """The naive split: consecutive runs, the first n % k runs one longer."""
    base, extra = divmod(n, k)
    parts, start = [], 0
    for part in range(k):
        size = base + (1 if part < extra else 0)
        parts.append(list(range(start, start + size)))
        start += size
    return parts


def _score(parts: list[list[int]], lengths: list[int]) -> tuple[int, int]:
    sums = [sum(lengths[i] for i in part) for part in parts]
    return max(sums), max(sums) - min(sums)
