"""Off-policy correction for rollouts sampled by a policy other than the one being trained."""

from __future__ import annotations

import math

import torch

from hybridflow.algorithms.settings import ISLevel, OffPolicyConfig
from hybridflow.algorithms.stats import as_bool_mask, masked_count, masked_mean, masked_sum

Tensor = torch.Tensor
def truncated_is_weights(prox_log_prob: Tensor, behaviour_log_prob: Tensor, response_mask: Tensor, *,
                         level: ISLevel, cap: float) -> tuple[Tensor, dict[str, Tensor]]:
    """Detached weights w [B, T] (0 at masked positions) and their metrics.

    Metrics (detached 0-dim tensors): is_weight_mean / is_weight_min / is_weight_max over the
    unit of `level` (tokens, or sequences with at least one token), is_frac_capped (share of
    units whose raw weight exceeded `cap`), behaviour_kl (k1 estimate of KL(mu || pi_prox)
    on the sampled tokens: mean(log mu - log pi_prox)).
    """
    if level not in ("token", "sequence"):
        raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")
    if prox_log_prob.shape != behaviour_log_prob.shape:
        raise ValueError(f"behaviour_log_prob shape {tuple(behaviour_log_prob.shape)} != "
                         f"prox_log_prob shape {tuple(prox_log_prob.shape)}")
    mask = as_bool_mask(response_mask, prox_log_prob, "response_mask")
    dtype = torch.promote_types(torch.promote_types(prox_log_prob.dtype, behaviour_log_prob.dtype), torch.float32)
    zero = torch.zeros((), dtype=dtype, device=prox_log_prob.device)
    log_ratio = torch.where(mask, prox_log_prob.detach().to(dtype) - behaviour_log_prob.detach().to(dtype), zero)
    log_cap = math.log(cap)
    if level == "token":
        log_w, unit_mask = log_ratio, mask
    else:
        log_w = log_ratio.sum(-1)  # log of the product of per-token ratios
        unit_mask = mask.any(-1)
    capped = (log_w > log_cap) & unit_mask
    w_unit = torch.exp(torch.clamp(log_w, max=log_cap))
    if level == "token":
        weights = torch.where(mask, w_unit, zero)
    else:
        weights = torch.where(mask, w_unit.unsqueeze(-1).expand_as(log_ratio), zero)
    big = torch.tensor(torch.finfo(dtype).max, dtype=dtype, device=w_unit.device)
    has_units = bool(unit_mask.any())
    metrics = {
        "is_weight_mean": masked_mean(w_unit, unit_mask),
        "is_weight_max": torch.where(unit_mask, w_unit, -big).max() if has_units else zero,
        "is_weight_min": torch.where(unit_mask, w_unit, big).min() if has_units else zero,
        "is_frac_capped": masked_mean(capped.to(dtype), unit_mask),
        "behaviour_kl": masked_mean(-log_ratio, mask),
    }
    return weights, {k: v.detach() for k, v in metrics.items()}


def apply_behaviour_weights(advantages: Tensor, prox_log_prob: Tensor, behaviour_log_prob: Tensor,
                            response_mask: Tensor, config: OffPolicyConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """Advantages of the decoupled objective, w * A (see the module docstring), and the
    weight metrics; the advantages unchanged (and no metrics) when the correction is off."""
    if not config.enabled:
        return advantages, {}
    weights, metrics = truncated_is_weights(prox_log_prob, behaviour_log_prob, response_mask,
                                            level=config.is_level, cap=config.is_cap)
    return advantages * weights.to(advantages.dtype), metrics


def staleness_metrics(policy_version: Tensor, response_mask: Tensor, current_version: int,
                      max_bucket: int = 8) -> dict[str, float]:
    """How many versions the trained tokens lag behind `current_version` (the version the
    update starts from): staleness/mean, staleness/max, and staleness/frac_<k> for k in
    0..max_bucket-1 plus staleness/frac_ge<max_bucket> (shares of response tokens)."""
    mask = as_bool_mask(response_mask, policy_version, "response_mask")
    lag = (current_version - policy_version.to(torch.int64))
    if bool((lag[mask] < 0).any()):
        raise ValueError(f"tokens carry a policy_version newer than the current version {current_version}")
    tokens = int(masked_count(mask))
    out = {"staleness/mean": float(masked_mean(lag.to(torch.float64), mask)),
           "staleness/max": float(lag[mask].max()) if tokens else 0.0}
    for k in range(max_bucket):
        out[f"staleness/frac_{k}"] = float(masked_sum((lag == k).to(torch.float64), mask)) / max(tokens, 1)
    out[f"staleness/frac_ge{max_bucket}"] = float(masked_sum((lag >= max_bucket).to(torch.float64), mask)) / max(tokens, 1)
    return out
