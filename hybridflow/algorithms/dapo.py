"""DAPO pieces: dynamic sampling filter and overlong reward shaping.

Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"
(arXiv 2503.14476). Clip-higher is `clip_ratio_high` of the PPO loss and token-level
aggregation is the `token-mean` mode; this module holds the two data-side pieces.
Config keys: `algorithm.dapo.filter_groups.{enable,max_extra_rounds}` (dynamic sampling),
`algorithm.dapo.overlong_buffer.{enable,len,penalty_factor}` (overlong shaping).
"""

from __future__ import annotations

import numpy as np
import torch

from hybridflow.algorithms.groups import group_index, group_stats

Tensor = torch.Tensor


def dynamic_sampling_filter(
    uid: np.ndarray, seq_rewards: np.ndarray | Tensor
) -> tuple[np.ndarray, dict[str, float]]:
    """Keep only groups whose rewards are not all equal (they carry no group-relative signal).

    A group whose samples all have exactly the same reward (all solved, all failed, or a
    group of one) gives every sample a zero group-relative advantage, so it only dilutes
    the batch. Returns a bool mask over samples and metrics: num_groups, kept_groups,
    dropped_groups, kept_samples, dropped_samples, kept_group_ratio. The trainer keeps
    sampling until enough groups are kept.
    """
    if isinstance(seq_rewards, Tensor):
        rewards = seq_rewards.detach().cpu().to(torch.float64)
    else:
        rewards = torch.as_tensor(np.asarray(seq_rewards, dtype=np.float64))
    if rewards.dim() != 1:
        raise ValueError(f"seq_rewards must be 1-D [B] (one reward per response), got shape {tuple(rewards.shape)}")
    if not torch.isfinite(rewards).all():
        raise ValueError("seq_rewards contains NaN or inf; fix the reward function before filtering")
    gid, n_groups = group_index(uid, rewards.shape[0], rewards.device)
    if n_groups == 0:
        return np.zeros(0, dtype=bool), _filter_metrics(0, 0, 0, 0)
    keep = ~group_stats(rewards, gid, n_groups).all_equal
    kept_groups = int(torch.zeros(n_groups, dtype=torch.bool).index_fill_(0, gid[keep], True).sum())
    kept_samples = int(keep.sum())
    metrics = _filter_metrics(n_groups, kept_groups, kept_samples, rewards.shape[0] - kept_samples)
    return keep.numpy(), metrics


def _filter_metrics(n_groups: int, kept_groups: int, kept: int, dropped: int) -> dict[str, float]:
    return {
        "num_groups": float(n_groups),
        "kept_groups": float(kept_groups),
        "dropped_groups": float(n_groups - kept_groups),
        "kept_samples": float(kept),
        "dropped_samples": float(dropped),
        "kept_group_ratio": kept_groups / n_groups if n_groups else 0.0,
    }


def overlong_reward_penalty(
    response_lengths: Tensor,
    max_response_length: int,
    overlong_buffer_len: int,
    penalty_factor: float,
) -> Tensor:
    """Soft overlong punishment R(|y|) <= 0, added to the task reward.

    With L = max_response_length and C = overlong_buffer_len:
    R = 0 for |y| <= L - C;  R = -penalty_factor * (|y| - (L - C)) / C for L - C < |y| <= L;
    R = -penalty_factor beyond L (DAPO Eq. 13, scaled by penalty_factor).
    """
    if not 0 < overlong_buffer_len <= max_response_length:
        raise ValueError(
            f"overlong_buffer_len must be in (0, max_response_length={max_response_length}], "
            f"got {overlong_buffer_len}"
        )
    if not penalty_factor >= 0:
        raise ValueError(f"penalty_factor must be >= 0, got {penalty_factor}")
    lengths = torch.as_tensor(response_lengths)
    if lengths.dim() != 1:
        raise ValueError(f"response_lengths must be 1-D [B], got shape {tuple(lengths.shape)}")
    expected = max_response_length - overlong_buffer_len
    excess = (lengths.to(torch.float32) - expected) / overlong_buffer_len
    return -penalty_factor * excess.clamp(0.0, 1.0)
