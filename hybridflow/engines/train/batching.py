"""Cutting a rank's batch into mini- and micro-batches, and packing away padding."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hybridflow.engines.train.distributed import current_device
from hybridflow.protocol import balanced_partition

Batch = dict[str, torch.Tensor]


def batch_len(batch: Mapping[str, torch.Tensor]) -> int:
    """Number of sequences; error if the tensors disagree or the batch is empty."""
    sizes = {k: v.shape[0] for k, v in batch.items()}
    if not sizes:
        raise ValueError("empty batch: no tensors given")
    if len(set(sizes.values())) != 1:
        raise ValueError(f"batch tensors disagree on the number of sequences: {sizes}")
    return next(iter(sizes.values()))


def require_keys(batch: Mapping[str, torch.Tensor], keys: tuple[str, ...], op: str) -> None:
    """Raise naming the missing tensors (and what is there) if `batch` lacks any of `keys`."""
    missing = [k for k in keys if k not in batch]
    if missing:
        raise KeyError(f"{op} needs batch tensors {missing}; the batch has {sorted(batch)}")


def select(batch: Mapping[str, torch.Tensor], index: torch.Tensor | list[int]) -> Batch:
    """Rows `index` of every tensor."""
    idx = torch.as_tensor(index, dtype=torch.long)
    return {k: v[idx.to(v.device)] for k, v in batch.items()}


def split_mini_batches(batch: Mapping[str, torch.Tensor], size: int) -> list[Batch]:
    """Consecutive mini-batches of `size` sequences; the batch must divide evenly."""
    n = batch_len(batch)
    if n % size != 0:
        raise ValueError(
            f"this rank got {n} sequences, not a multiple of the per-rank mini-batch size {size} "
            "(mini_batch_size / dp); make the training batch a multiple of mini_batch_size"
        )
    return [select(batch, list(range(s, s + size))) for s in range(0, n, size)]


def sequence_costs(attention_mask: torch.Tensor, packed: bool) -> list[int]:
    """Tokens each sequence costs in a forward: its valid tokens if packed, else the padded length."""
    if packed:
        return attention_mask.sum(dim=-1).tolist()
    return [attention_mask.shape[1]] * attention_mask.shape[0]


def dp_balanced_order(attention_mask: torch.Tensor, dp_size: int) -> torch.Tensor:
    """Permutation of the rows after which `dp_size` equal contiguous chunks have near-equal
    token sums (``attention_mask.sum(-1)``), at every position, not only in total.

    Without reordering, rank r gets rows ``r*c .. r*c+c-1`` (c = n / dp_size); call the
    rows at offset i of every chunk the i-th "slot". Slot by slot, the longest row of the
    slot goes to the rank with the fewest tokens so far, the second longest to the second
    fewest, and so on. Why slots and not a free partition (Karmarkar-Karp over the whole
    batch): ranks cut their chunk into mini- and micro-batches by position, with the same
    shuffle on every rank, so a step's samples are a union of slots. Moving rows only
    inside a slot keeps every optimizer step's sample set, so training results equal the
    unbalanced ones up to float summation order. Balance: after each slot the spread of
    the ranks' running totals is at most the longest row (sorted longest-to-lightest
    assignment keeps it there), so every step, not just the whole batch, is balanced
    within two sequence lengths.
    """
    n = attention_mask.shape[0]
    if dp_size < 1 or n % dp_size != 0:
        raise ValueError(f"batch of {n} sequences cannot be split evenly over {dp_size} dp ranks")
    chunk = n // dp_size
    lengths = attention_mask.sum(dim=-1).tolist()
    totals = [0] * dp_size
    order = [0] * n
    for slot in range(chunk):
        rows = sorted((rank * chunk + slot for rank in range(dp_size)), key=lambda row: -lengths[row])
        ranks = sorted(range(dp_size), key=lambda rank: totals[rank])
        for row, rank in zip(rows, ranks):
            order[rank * chunk + slot] = row
            totals[rank] += lengths[row]
    return torch.tensor(order, dtype=torch.long)


def merge_micro_metrics(per_micro: list[tuple[dict, dict]]) -> tuple[dict[str, float], dict[str, float]]:
    """(summed, averaged) metrics of one mini-batch from each micro-batch's (sums, means):
    loss-type values add up over micro-batches (each is already normalised by the whole
    mini-batch), ratio-type values are averaged over them."""
    summed: dict[str, float] = {}
    averaged: dict[str, float] = {}
    for sums, means in per_micro:
        for k, v in sums.items():
            summed[k] = summed.get(k, 0.0) + float(v)
        for k, v in means.items():
            averaged[k] = averaged.get(k, 0.0) + float(v) / len(per_micro)
    return summed, averaged


def micro_batch_indices_by_count(n: int, size: int) -> list[list[int]]:
    """Consecutive groups of `size` indices (the last one may be shorter)."""
    return [list(range(s, min(s + size, n))) for s in range(0, n, size)]


def micro_batch_indices_by_tokens(
    costs: list[int],
    max_tokens: int,
    group: dist.ProcessGroup | None,
) -> list[list[int]]:
    """Balanced groups of sequence indices whose costs sum to at most `max_tokens`.

    Collective over `group` (every rank that shares the model's collectives): all ranks
    return the same number of groups.
    """
    too_long = [c for c in costs if c > max_tokens]
    if too_long:
        raise ValueError(
            f"a sequence of {max(too_long)} tokens exceeds the micro-batch token budget "
            f"{max_tokens}; raise max_tokens_per_device (or forward_max_tokens_per_device) "
            "to at least the longest sequence"
        )
    k = max(1, math.ceil(sum(costs) / max_tokens))
    while True:
        k = _all_reduce_int(k, dist.ReduceOp.MAX, group)
        parts = _non_empty(balanced_partition(costs, min(k, len(costs)), equal_size=False))
        parts += [[] for _ in range(k - len(parts))]
        fits = int(all(sum(costs[i] for i in p) <= max_tokens for p in parts))
        if _all_reduce_int(fits, dist.ReduceOp.MIN, group):
            return parts
        k += 1


def check_same_count(count: int, what: str, group: dist.ProcessGroup | None) -> None:
    """Raise on every rank (instead of hanging in a collective) if ranks disagree on `count`."""
    low = -_all_reduce_int(-count, dist.ReduceOp.MAX, group)
    high = _all_reduce_int(count, dist.ReduceOp.MAX, group)
    if low != high:
        raise ValueError(
            f"ranks disagree on the number of {what} ({low} to {high}); FSDP/TP run collectives "
            "in every forward, so every rank must get a batch of the same size (dispatch equal "
            "chunks) or use dynamic batch size"
        )


def _non_empty(parts: list[list[int]]) -> list[list[int]]:
    # The differencing method may leave a part empty even when there are enough
    # sequences; an empty micro-batch would waste a forward, so move one sequence
    # from the part with the most sequences.
    parts = [list(p) for p in parts]
    for p in parts:
        if not p:
            donor = max(parts, key=len)
            if len(donor) > 1:
                p.append(donor.pop())
    return [sorted(p) for p in parts if p]


def _all_reduce_int(value: int, op: dist.ReduceOp, group: dist.ProcessGroup | None) -> int:
    t = torch.tensor([value], dtype=torch.int64, device=current_device())
    dist.all_reduce(t, op=op, group=group)
    return int(t.item())


@dataclass
class PackedBatch:
    """The valid tokens of a [B, S] batch as one row (see module docstring).

    indices: flat positions (into B*S) of the valid tokens, in order.
    """

    input_ids: torch.Tensor  # [1, N]
    position_ids: torch.Tensor  # [1, N]
    indices: torch.Tensor  # [N]
    shape: tuple[int, int]  # (B, S)


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> PackedBatch:
    """Remove padding: concatenate the valid tokens of all rows into one row."""
    if position_ids.dim() != 2:
        raise ValueError(
            f"sequence packing supports [B, S] position_ids only, got shape {tuple(position_ids.shape)}"
        )
    valid = attention_mask.reshape(-1).bool()
    indices = valid.nonzero().squeeze(-1)
    packed_pos = position_ids.reshape(-1)[indices]
    # Sequence starts in the packed row must have position 0, otherwise attention could
    # not tell where one sequence ends and the next begins.
    starts = torch.zeros_like(attention_mask, dtype=torch.bool)
    first = attention_mask.bool().int().argmax(dim=-1)
    starts[torch.arange(starts.shape[0]), first] = True
    starts &= attention_mask.bool()
    if (position_ids[starts] != 0).any():
        raise ValueError(
            "pack_sequences needs position_ids that start at 0 at each sequence's first valid token "
            "(e.g. cumsum(attention_mask) - 1); got other start positions"
        )
    return PackedBatch(
        input_ids=input_ids.reshape(-1)[indices].unsqueeze(0),
        position_ids=packed_pos.unsqueeze(0),
        indices=indices,
        shape=(input_ids.shape[0], input_ids.shape[1]),
    )


def unpack(values: torch.Tensor, packed: PackedBatch, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Scatter per-token `values` back to a zero-filled [B, S] tensor.

    values: one value per packed token, or per entry of `positions` (indices into the
    packed row) when only some tokens were computed.
    """
    b, s = packed.shape
    out = torch.zeros(b * s, dtype=values.dtype, device=values.device)
    flat = packed.indices if positions is None else packed.indices[positions]
    out = out.index_put((flat.to(values.device),), values.reshape(-1))
    return out.view(b, s)
