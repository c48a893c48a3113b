"""Reward-model loss: the Bradley-Terry pairwise objective.

For a pair scored r_c (chosen) and r_r (rejected), P(chosen preferred) = sigmoid(r_c - r_r)
(Bradley & Terry 1952; as a reward-model loss in Ouyang et al. 2022, arXiv 2203.02155), and
the loss is its negative log-likelihood, averaged over pairs:

    l = -log sigmoid(r_c - r_r)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hybridflow.algorithms.aggregation import AggregationScale, agg_loss

Tensor = torch.Tensor


def _pair_mean(values: Tensor, agg: AggregationScale | None) -> Tensor:
    # One "token" per pair: token-mean over a [B, 1] matrix is the (global) mean over pairs.
    mask = torch.ones(values.shape[0], 1, dtype=torch.bool, device=values.device)
    return agg_loss(values.unsqueeze(-1), mask, "token-mean", agg)


def bradley_terry_loss(
    chosen_scores: Tensor,
    rejected_scores: Tensor,
    agg: AggregationScale | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Mean of -log sigmoid(chosen - rejected) over pairs, and detached metrics.

    chosen_scores / rejected_scores: [B] scores of the two responses of each pair.
    agg: global pair counts of the mini-batch (see module docstring); None averages over
        the given pairs.
    Metrics (pair means, normalised like the loss): accuracy (share of pairs with
    chosen > rejected), margin (chosen - rejected), chosen_score, rejected_score.
    """
    if chosen_scores.dim() != 1 or chosen_scores.shape != rejected_scores.shape:
        raise ValueError(
            f"chosen_scores and rejected_scores must both be [B] with the same B, got "
            f"{tuple(chosen_scores.shape)} and {tuple(rejected_scores.shape)}"
        )
    if chosen_scores.numel() == 0:
        raise ValueError("bradley_terry_loss got no pairs")
    chosen, rejected = chosen_scores.float(), rejected_scores.float()
    margin = chosen - rejected
    loss = _pair_mean(-F.logsigmoid(margin), agg)
    with torch.no_grad():
        metrics = {
            "accuracy": _pair_mean((margin > 0).float(), agg),
            "margin": _pair_mean(margin, agg),
            "chosen_score": _pair_mean(chosen, agg),
            "rejected_score": _pair_mean(rejected, agg),
        }
    return loss, metrics


def pairwise_accuracy(chosen_scores: Tensor, rejected_scores: Tensor) -> float:
    """Share of pairs whose chosen response scores strictly higher (ties count as wrong)."""
    if chosen_scores.shape != rejected_scores.shape or chosen_scores.numel() == 0:
        raise ValueError(
            f"need two non-empty score vectors of one shape, got {tuple(chosen_scores.shape)} and "
            f"{tuple(rejected_scores.shape)}"
        )
    return float((chosen_scores > rejected_scores).double().mean())
