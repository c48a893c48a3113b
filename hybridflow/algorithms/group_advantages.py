"""Critic-free advantage estimators with a per-prompt group baseline (grpo, rloo, ...).

All take the outcome score s_i = sum_t r_{i,t} of each response (token rewards summed
over the response mask), compute a sequence advantage a_i from the samples that share
its `uid`, and give a_i to every unmasked token of response i. Returns equal the
advantages (there is no critic to regress). Groups of one sample follow the convention in
`groups.py` (baseline 0, std 1). Signature: see `advantages.py`.
"""

from __future__ import annotations

import numpy as np
import torch

from hybridflow.algorithms.advantages import AdvantageConfig, check_inputs, register_adv_estimator
from hybridflow.algorithms.groups import (
    baseline_and_scale,
    broadcast_to_tokens,
    centred_scores,
    group_index,
    group_stats,
    sequence_scores,
)
from hybridflow.algorithms.stats import masked_whiten

Tensor = torch.Tensor


def _prepare(rewards: Tensor, response_mask: Tensor, uid: np.ndarray | None) -> tuple[Tensor, Tensor, int, Tensor]:
    """(bool mask, dense group ids, number of groups, float64 outcome scores)."""
    mask = check_inputs(rewards, response_mask)
    gid, n_groups = group_index(uid, rewards.shape[0], rewards.device)
    scores = sequence_scores(rewards, mask)
    return mask, gid, n_groups, scores


def _finish(seq_adv: Tensor, mask: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    adv = broadcast_to_tokens(seq_adv, mask, dtype)
    return adv, adv.clone()


@register_adv_estimator("grpo")
def compute_grpo(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    values: Tensor | None = None,
    uid: np.ndarray | None = None,
    config: AdvantageConfig,
    **extra: object,
) -> tuple[Tensor, Tensor]:
    """GRPO: a_i = (s_i - mean_g s) / (std_g s + eps), std unbiased; without std if Dr.GRPO.

    Shao et al. 2024, "DeepSeekMath" (arXiv 2402.03300). With
    `norm_adv_by_std_in_grpo=False`: a_i = s_i - mean_g s (Dr.GRPO, Liu et al. 2025,
    arXiv 2503.20783). Groups whose rewards are all equal get a_i = 0.
    """
    with torch.no_grad():
        mask, gid, n_groups, scores = _prepare(token_level_rewards, response_mask, uid)
        stats = group_stats(scores, gid, n_groups)
        _, std = baseline_and_scale(stats)
        adv = centred_scores(scores, stats)
        if config.norm_adv_by_std_in_grpo:
            adv = adv / (std + config.epsilon)
        return _finish(adv, mask, token_level_rewards.dtype)


@register_adv_estimator("grpo_passk")
def compute_grpo_passk(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    values: Tensor | None = None,
    uid: np.ndarray | None = None,
    config: AdvantageConfig,
    **extra: object,
) -> tuple[Tensor, Tensor]:
    """Pass@k: only the group's best sample is credited, a_best = (s_(1) - s_(2)) / (std_g + eps).

    Tang et al. 2025, "Optimizing Language Models for Inference Time Objectives using
    Reinforcement Learning" (arXiv 2503.19595). s_(1), s_(2) are the largest and second
    largest score of the group; every other sample gets 0. Ties for the best go to the
    first sample in batch order (and then a_best = 0). The std division follows
    `norm_adv_by_std_in_grpo`.
    """
    with torch.no_grad():
        mask, gid, n_groups, scores = _prepare(token_level_rewards, response_mask, uid)
        stats = group_stats(scores, gid, n_groups)
        _, std = baseline_and_scale(stats)
        batch = scores.shape[0]
        arange = torch.arange(batch, device=scores.device)
        gmax = torch.full((n_groups,), -torch.inf, dtype=scores.dtype, device=scores.device)
        gmax = gmax.scatter_reduce(0, gid, scores, "amax")
        candidates = torch.where(scores == gmax[gid], arange, torch.full_like(arange, batch))
        first_best = torch.full((n_groups,), batch, dtype=torch.int64, device=scores.device)
        first_best = first_best.scatter_reduce(0, gid, candidates, "amin")
        is_best = arange == first_best[gid]
        others = torch.where(is_best, torch.full_like(scores, -torch.inf), scores)
        second = torch.full_like(gmax, -torch.inf).scatter_reduce(0, gid, others, "amax")[gid]
        # A group of one has no second best: its baseline is 0 (groups.py convention).
        second = torch.where(stats.count == 1, torch.zeros_like(second), second)
        adv = torch.where(is_best, scores - second, torch.zeros_like(scores))
        if config.norm_adv_by_std_in_grpo:
            adv = adv / (std + config.epsilon)
        return _finish(adv, mask, token_level_rewards.dtype)


@register_adv_estimator("rloo")
def compute_rloo(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    values: Tensor | None = None,
    uid: np.ndarray | None = None,
    config: AdvantageConfig,
    **extra: object,
) -> tuple[Tensor, Tensor]:
    """RLOO: a_i = s_i - mean_{j != i} s_j = n/(n-1) (s_i - mean_g s).

    Kool et al. 2019 ("Buy 4 REINFORCE samples, get a baseline for free!"); Ahmadian et
    al. 2024, "Back to Basics" (arXiv 2402.14740).
    """
    with torch.no_grad():
        mask, gid, n_groups, scores = _prepare(token_level_rewards, response_mask, uid)
        stats = group_stats(scores, gid, n_groups)
        n = stats.count
        # For n == 1 centred_scores returns s itself and the factor is 1 (clamp).
        adv = n / (n - 1).clamp(min=1) * centred_scores(scores, stats)
        return _finish(adv, mask, token_level_rewards.dtype)


@register_adv_estimator("reinforce_plus_plus_baseline")
def compute_reinforce_plus_plus_baseline(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    values: Tensor | None = None,
    uid: np.ndarray | None = None,
    config: AdvantageConfig,
    **extra: object,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ with baseline: A_{i,t} = whiten_batch(s_i - mean_g s) over all response tokens.

    Hu 2025, "REINFORCE++" (arXiv 2501.03262): group-mean baseline first, then whitening
    over every unmasked token of the batch (batch-level semantics of `masked_whiten`).
    """
    with torch.no_grad():
        mask, gid, n_groups, scores = _prepare(token_level_rewards, response_mask, uid)
        stats = group_stats(scores, gid, n_groups)
        centred = broadcast_to_tokens(centred_scores(scores, stats), mask, torch.float64)
        adv = masked_whiten(centred, mask).to(token_level_rewards.dtype)
        return adv, adv.clone()


@register_adv_estimator("opo")
def compute_opo(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    values: Tensor | None = None,
    uid: np.ndarray | None = None,
    config: AdvantageConfig,
    **extra: object,
) -> tuple[Tensor, Tensor]:
    """OPO: a_i = s_i - b_g, b_g = sum_j |y_j| s_j / sum_j |y_j| (length-weighted group mean).

    Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline" (arXiv 2505.23585);
    |y_j| is the number of unmasked tokens of response j. A group whose responses are all
    empty has baseline 0.
    """
    with torch.no_grad():
        mask, gid, n_groups, scores = _prepare(token_level_rewards, response_mask, uid)
        stats = group_stats(scores, gid, n_groups)
        lengths = mask.sum(dim=-1).to(torch.float64)
        num = torch.zeros(n_groups, dtype=torch.float64, device=scores.device).index_add_(0, gid, lengths * scores)
        den = torch.zeros_like(num).index_add_(0, gid, lengths)
        baseline = torch.where(den > 0, num / den.clamp(min=1), torch.zeros_like(num))[gid]
        baseline = torch.where(stats.count == 1, torch.zeros_like(baseline), baseline)
        adv = torch.where(stats.all_equal & (stats.count > 1), torch.zeros_like(scores), scores - baseline)
        return _finish(adv, mask, token_level_rewards.dtype)


@register_adv_estimator("gpg")
def compute_gpg(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    values: Tensor | None = None,
    uid: np.ndarray | None = None,
    config: AdvantageConfig,
    **extra: object,
) -> tuple[Tensor, Tensor]:
    """GPG: a_i = alpha (s_i - mean_g s) / F_norm, alpha = B / (B - M).

    Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
    Reasoning" (arXiv 2504.02546). M counts samples in groups (size >= 2) whose rewards
    are all equal: they get zero advantage, and alpha rescales the batch so the remaining
    valid samples carry the full gradient. F_norm = std_g + eps if
    `config.gpg_norm_by_std`, else 1.
    """
    with torch.no_grad():
        mask, gid, n_groups, scores = _prepare(token_level_rewards, response_mask, uid)
        stats = group_stats(scores, gid, n_groups)
        _, std = baseline_and_scale(stats)
        batch = scores.shape[0]
        invalid = int((stats.all_equal & (stats.count > 1)).sum())
        alpha = batch / max(batch - invalid, 1)
        adv = alpha * centred_scores(scores, stats)
        if config.gpg_norm_by_std:
            adv = adv / (std + config.epsilon)
        return _finish(adv, mask, token_level_rewards.dtype)
