"""Group bookkeeping for group-baseline estimators: uid -> group index, per-group statistics.

A group is the set of samples that share a `uid` (responses to the same prompt). All
statistics are computed in float64 on [B] vectors, because a group mean of float32
rewards that are offset by a large constant would otherwise lose the differences that
the advantage is made of.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

Tensor = torch.Tensor


def group_index(uid: np.ndarray | list | Tensor | None, batch_size: int, device: torch.device) -> tuple[Tensor, int]:
    """Map each sample's uid to a dense group id in [0, G); returns (ids [B] int64, G)."""
    if uid is None:
        raise ValueError(
            "this estimator needs `uid` (np.ndarray [B] of group ids, one per prompt); "
            "set it when repeating prompts for rollout"
        )
    if isinstance(uid, torch.Tensor):
        arr = uid.detach().cpu().numpy()
    elif isinstance(uid, np.ndarray):
        arr = uid
    else:
        arr = np.asarray(uid, dtype=object)
    if arr.shape != (batch_size,):
        raise ValueError(f"uid must have shape ({batch_size},), got {arr.shape}")
    ids: dict[object, int] = {}
    try:
        dense = [ids.setdefault(u, len(ids)) for u in arr.tolist()]
    except TypeError as err:
        raise ValueError(f"uid entries must be hashable (str or int), got {err}") from None
    return torch.tensor(dense, dtype=torch.int64, device=device), len(ids)


@dataclass(frozen=True)
class GroupStats:
    """Per-sample statistics of the sample's group (all [B], float64)."""

    count: Tensor
    mean: Tensor
    std: Tensor  # unbiased group std (0 for groups of one)
    all_equal: Tensor  # bool: every reward in the group is identical (groups of one included)


def group_stats(scores: Tensor, gid: Tensor, n_groups: int) -> GroupStats:
    """Group size, mean, unbiased std and all-equal flag, broadcast back to samples."""
    s = scores.to(torch.float64)
    count = torch.zeros(n_groups, dtype=torch.float64, device=s.device).index_add_(0, gid, torch.ones_like(s))
    mean = torch.zeros_like(count).index_add_(0, gid, s) / count
    sq = torch.zeros_like(count).index_add_(0, gid, (s - mean[gid]) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    gmax = torch.full_like(count, -torch.inf).scatter_reduce(0, gid, s, "amax")
    gmin = torch.full_like(count, torch.inf).scatter_reduce(0, gid, s, "amin")
    return GroupStats(count[gid], mean[gid], std[gid], (gmax == gmin)[gid])


def baseline_and_scale(stats: GroupStats) -> tuple[Tensor, Tensor]:
    """(group mean, group std) with the groups-of-one convention: (0, 1)."""
    single = stats.count == 1
    mean = torch.where(single, torch.zeros_like(stats.mean), stats.mean)
    std = torch.where(single, torch.ones_like(stats.std), stats.std)
    return mean, std


def centred_scores(scores: Tensor, stats: GroupStats) -> Tensor:
    """s_i - mean_g s, exactly 0 for all-equal groups and s_i for groups of one.

    Forcing the all-equal case to 0 matters: the float mean of identical values can differ
    from them in the last bit, and a later std division or whitening would blow that
    rounding residue up into a spurious O(1) advantage.
    """
    s = scores.to(torch.float64)
    diff = torch.where(stats.all_equal, torch.zeros_like(s), s - stats.mean)
    return torch.where(stats.count == 1, s, diff)


def sequence_scores(token_level_rewards: Tensor, mask: Tensor) -> Tensor:
    """Outcome score of each response: sum of its unmasked token rewards, float64 [B]."""
    zero = torch.zeros((), dtype=token_level_rewards.dtype, device=token_level_rewards.device)
    return torch.where(mask, token_level_rewards, zero).sum(dim=-1).to(torch.float64)


def broadcast_to_tokens(seq_values: Tensor, mask: Tensor, dtype: torch.dtype) -> Tensor:
    """[B] -> [B, T]: every unmasked token of a response gets its sequence's value."""
    tok = seq_values.to(dtype).unsqueeze(-1).expand(mask.shape)
    return torch.where(mask, tok, torch.zeros((), dtype=dtype, device=tok.device))


def silent_groups(advantages: Tensor, mask: Tensor, uid: np.ndarray | list | Tensor) -> tuple[int, int]:
    """(groups whose every response token has advantage exactly 0, all groups).

    A silent group gives the policy gradient nothing: its responses scored alike (or, with a
    critic, the values matched the returns). When every group is silent, an update trains on
    nothing but its KL and entropy terms; the trainer says so (trainer.max_no_signal_steps).
    """
    gid, n_groups = group_index(uid, advantages.shape[0], advantages.device)
    moving = torch.where(mask.bool(), advantages != 0, torch.zeros((), dtype=torch.bool, device=advantages.device))
    moving_samples = torch.zeros(n_groups, dtype=torch.int64, device=advantages.device)
    moving_samples.index_add_(0, gid, moving.any(dim=-1).long())
    return int((moving_samples == 0).sum()), n_groups
