"""Loss aggregation: from a [B, T] per-token loss matrix to the scalar that is backpropagated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch

from hybridflow.registry import Registry
from hybridflow.algorithms.settings import LOSS_AGG_MODES
from hybridflow.algorithms.stats import as_bool_mask, masked_count

Tensor = torch.Tensor


@dataclass(frozen=True)
class AggregationScale:
    """Global normalisers for one mini-batch (see module docstring).

    global_tokens: response tokens in the whole mini-batch (all micro-batches, all dp ranks).
    global_seqs: sequences with at least one response token in the whole mini-batch.
    dp_size: ranks whose gradients the FSDP reduce averages; local losses are scaled by it.
    loss_scale_factor: constant L of `seq-mean-token-sum-norm` (e.g. the max response
        length); None falls back to the padded length T of the tensor being aggregated,
        which is split invariant only if every micro-batch is padded to the same T.
    """

    global_tokens: int
    global_seqs: int
    dp_size: int = 1
    loss_scale_factor: float | None = None

    def __post_init__(self) -> None:
        if self.global_tokens < 0 or self.global_seqs < 0:
            raise ValueError(
                f"AggregationScale counts must be >= 0, got global_tokens={self.global_tokens}, "
                f"global_seqs={self.global_seqs}"
            )
        if self.dp_size < 1:
            raise ValueError(f"AggregationScale.dp_size must be >= 1, got {self.dp_size}")
        if self.loss_scale_factor is not None and not self.loss_scale_factor > 0:
            raise ValueError(
                f"AggregationScale.loss_scale_factor must be > 0 (e.g. the max response "
                f"length), got {self.loss_scale_factor}"
            )


class AggFn(Protocol):
    def __call__(self, loss_mat: Tensor, mask: Tensor, agg: AggregationScale | None) -> Tensor: ...


_AGG_MODES: Registry[AggFn] = LOSS_AGG_MODES


def register_loss_agg_mode(name: str, *, override: bool = False) -> Callable[[AggFn], AggFn]:
    """Register `fn(loss_mat, bool_mask, agg) -> scalar` as an aggregation mode."""
    return _AGG_MODES.register(name, override=override)


def get_loss_agg_mode(name: str) -> AggFn:
    """The aggregation function for `name`; ValueError listing known modes if unknown."""
    return _AGG_MODES.get(name)


def loss_agg_modes() -> list[str]:
    """Names of all registered aggregation modes."""
    return _AGG_MODES.names()


def agg_loss(
    loss_mat: Tensor,
    loss_mask: Tensor,
    loss_agg_mode: str,
    agg: AggregationScale | None = None,
) -> Tensor:
    """Reduce a [B, T] loss matrix to a scalar with the named mode (see module docstring)."""
    if loss_mat.dim() != 2:
        raise ValueError(f"loss_mat must be [B, T], got shape {tuple(loss_mat.shape)}")
    mask = as_bool_mask(loss_mask, loss_mat, "loss_mask")
    return get_loss_agg_mode(loss_agg_mode)(loss_mat, mask, agg)


def _token_sums(loss_mat: Tensor, mask: Tensor) -> Tensor:
    # where (not multiply) so NaN/inf at padded positions cannot reach the sum or the gradient.
    zero = torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device)
    return torch.where(mask, loss_mat, zero).sum(dim=-1)


def _local_count(n: Tensor, like: Tensor) -> Tensor:
    # Kept as a tensor (no .item()) so a GPU worker does not synchronise per micro-batch.
    return n.to(like.dtype).clamp(min=1)


def _local_seqs(mask: Tensor, like: Tensor) -> Tensor:
    return _local_count((mask.sum(dim=-1) > 0).sum(), like)


@register_loss_agg_mode("token-mean")
def _token_mean(loss_mat: Tensor, mask: Tensor, agg: AggregationScale | None) -> Tensor:
    total = _token_sums(loss_mat, mask).sum()
    if agg is None:
        return total / _local_count(mask.sum(), total)
    return total * agg.dp_size / max(agg.global_tokens, 1)


@register_loss_agg_mode("seq-mean-token-sum")
def _seq_mean_token_sum(loss_mat: Tensor, mask: Tensor, agg: AggregationScale | None) -> Tensor:
    total = _token_sums(loss_mat, mask).sum()
    if agg is None:
        return total / _local_seqs(mask, total)
    return total * agg.dp_size / max(agg.global_seqs, 1)


@register_loss_agg_mode("seq-mean-token-mean")
def _seq_mean_token_mean(loss_mat: Tensor, mask: Tensor, agg: AggregationScale | None) -> Tensor:
    per_seq_tokens = mask.sum(dim=-1).to(loss_mat.dtype).clamp(min=1)
    seq_means = _token_sums(loss_mat, mask) / per_seq_tokens  # empty rows give 0
    if agg is None:
        return seq_means.sum() / _local_seqs(mask, seq_means)
    return seq_means.sum() * agg.dp_size / max(agg.global_seqs, 1)


@register_loss_agg_mode("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(loss_mat: Tensor, mask: Tensor, agg: AggregationScale | None) -> Tensor:
    total = _token_sums(loss_mat, mask).sum()
    if agg is None:
        return total / (_local_seqs(mask, total) * mask.shape[-1])
    norm = agg.loss_scale_factor if agg.loss_scale_factor is not None else mask.shape[-1]
    return total * agg.dp_size / (max(agg.global_seqs, 1) * norm)


def compute_aggregation_scale(
    micro_batch_masks: Sequence[Tensor],
    *,
    dp_size: int = 1,
    all_reduce_sum: Callable[[Tensor], Tensor] | None = None,
    loss_scale_factor: float | None = None,
) -> AggregationScale:
    """Global token/sequence counts of one mini-batch, for `agg_loss(..., agg=...)`.

    micro_batch_masks: this rank's response masks, one per micro-batch of the mini-batch.
    dp_size: number of data-parallel ranks whose gradients are averaged.
    all_reduce_sum: sums a 1-D int64 tensor over the dp ranks and returns it (e.g.
        `torch_all_reduce_sum(group)`); required when dp_size > 1, because local counts
        alone would normalise each rank differently.
    """
    if not micro_batch_masks:
        raise ValueError("compute_aggregation_scale needs at least one micro-batch mask")
    if dp_size > 1 and all_reduce_sum is None:
        raise ValueError(
            f"dp_size={dp_size} but no all_reduce_sum was given: the counts must be summed over "
            "the data-parallel ranks (pass torch_all_reduce_sum(dp_group))"
        )
    device = micro_batch_masks[0].device
    counts = torch.zeros(2, dtype=torch.int64, device=device)
    for mask in micro_batch_masks:
        if mask.dim() != 2:
            raise ValueError(f"each micro-batch mask must be [B, T], got shape {tuple(mask.shape)}")
        m = mask if mask.dtype == torch.bool else mask != 0
        counts[0] += masked_count(m).to(device)
        counts[1] += (m.sum(dim=-1) > 0).sum().to(device)
    if all_reduce_sum is not None:
        counts = all_reduce_sum(counts)
    return AggregationScale(
        global_tokens=int(counts[0]),
        global_seqs=int(counts[1]),
        dp_size=dp_size,
        loss_scale_factor=loss_scale_factor,
    )


def torch_all_reduce_sum(group: object | None = None) -> Callable[[Tensor], Tensor]:
    """An `all_reduce_sum` for `compute_aggregation_scale` backed by torch.distributed."""
    import torch.distributed as dist

    def reduce(t: Tensor) -> Tensor:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        return t

    return reduce
