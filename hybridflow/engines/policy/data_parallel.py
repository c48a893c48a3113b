"""Data parallelism of the small policy learners over torch.distributed (gloo on CPU).

Every learner rank holds the whole (small) network and a slice of each minibatch; after
backward the gradients are averaged over the ranks in one flat all-reduce, so every rank
takes the same optimizer step and the replicas stay identical. Outside an initialised
process group (one rank, in-process runs) every function here is a no-op or local.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

Tensor = torch.Tensor


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def average_gradients(params: Iterable[torch.nn.Parameter]) -> None:
    """Average .grad over all ranks (one collective for all parameters)."""
    if world_size() == 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def global_mean_std(x: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and unbiased std of x over every rank's elements (the local ones when alone)."""
    if world_size() == 1:
        return x.mean(), (x.std() if x.numel() > 1 else torch.zeros((), dtype=x.dtype))
    sums = torch.stack([torch.tensor(float(x.numel()), dtype=torch.float64), x.double().sum(), x.double().square().sum()])
    dist.all_reduce(sums)
    n, total, total_sq = sums
    mean = total / n
    var = ((total_sq - n * mean.square()) / (n - 1).clamp_min(1.0)).clamp_min(0.0)
    return mean.to(x.dtype), var.sqrt().to(x.dtype)


def mean_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """Every value averaged over the ranks (all ranks pass the same keys)."""
    if world_size() == 1 or not values:
        return dict(values)
    names = sorted(values)
    t = torch.tensor([values[n] for n in names], dtype=torch.float64)
    dist.all_reduce(t)
    t /= world_size()
    return dict(zip(names, t.tolist()))
