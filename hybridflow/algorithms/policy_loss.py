"""Policy losses (config key `actor.loss.policy.loss_mode`): PPO clip, GSPO, CISPO, REINFORCE, GPG.

Uniform signature:

    fn(old_log_prob [B, T], log_prob [B, T], advantages [B, T], response_mask [B, T], *,
       config: PolicyLossConfig, agg: AggregationScale | None = None) -> (loss, metrics)
"""

from __future__ import annotations

import math
from typing import Callable, Protocol

import torch

from hybridflow.algorithms.aggregation import AggregationScale, agg_loss
from hybridflow.registry import Registry
from hybridflow.algorithms.settings import POLICY_LOSSES, PolicyLossConfig
from hybridflow.algorithms.stats import as_bool_mask, float_dtype, masked_mean

Tensor = torch.Tensor


class PolicyLossFn(Protocol):
    def __call__(
        self,
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor | None,
        *,
        config: PolicyLossConfig,
        agg: AggregationScale | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]: ...


_POLICY_LOSSES: Registry[PolicyLossFn] = POLICY_LOSSES


def register_policy_loss(name: str, *, override: bool = False) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: register a policy loss with the uniform signature under `name`."""
    return _POLICY_LOSSES.register(name, override=override)


def get_policy_loss(name: str) -> PolicyLossFn:
    """The policy loss registered as `name`; ValueError listing known names if unknown."""
    return _POLICY_LOSSES.get(name)


def policy_losses() -> list[str]:
    """Names of all registered policy losses."""
    return _POLICY_LOSSES.names()


def compute_policy_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    config: PolicyLossConfig,
    agg: AggregationScale | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Run the loss named by `config.loss_mode`."""
    fn = get_policy_loss(config.loss_mode)
    return fn(old_log_prob, log_prob, advantages, response_mask, config=config, agg=agg)


# ----------------------------------------------------------------------------- helpers


def _prepare(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor, response_mask: Tensor):
    """Validate shapes and zero every input at masked positions (gradient there is then 0)."""
    if log_prob.dim() != 2:
        raise ValueError(f"log_prob must be [B, T], got shape {tuple(log_prob.shape)}")
    for name, t in (("old_log_prob", old_log_prob), ("advantages", advantages)):
        if t.shape != log_prob.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != log_prob shape {tuple(log_prob.shape)}")
    mask = as_bool_mask(response_mask, log_prob, "response_mask")
    dtype = float_dtype(log_prob, old_log_prob, advantages)
    zero = torch.zeros((), dtype=dtype, device=log_prob.device)
    old = torch.where(mask, old_log_prob.detach().to(dtype), zero)
    new = torch.where(mask, log_prob.to(dtype), zero)
    adv = torch.where(mask, advantages.detach().to(dtype), zero)
    return old, new, adv, mask


def _frac(cond: Tensor, mask: Tensor) -> Tensor:
    return masked_mean(cond.to(torch.float32), mask).detach()


def _kl_metric(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """k1 estimate of KL(pi_old || pi) on tokens sampled from pi_old: mean(log pi_old - log pi)."""
    return masked_mean(-log_ratio, mask).detach()


def _clip_metrics(clip_low: Tensor, clip_high: Tensor, log_ratio: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Clip fractions (either side, low, high) and the approximate KL to the old policy."""
    return {
        "pg_clipfrac": _frac(clip_low | clip_high, mask),
        "pg_clipfrac_low": _frac(clip_low, mask),
        "pg_clipfrac_high": _frac(clip_high, mask),
        "ppo_kl": _kl_metric(log_ratio, mask),
    }


# ----------------------------------------------------------------------------- losses


@register_policy_loss("vanilla")
def ppo_clip_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor | None,
    *,
    config: PolicyLossConfig,
    agg: AggregationScale | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clip: l = max(-A r, -A clip(r, 1-eps_lo, 1+eps_hi)); for A < 0 also min(l, -A c).

    r = exp(log pi - log pi_old). Schulman et al. 2017 (arXiv 1707.06347); separate low and
    high ranges: DAPO clip-higher (Yu et al. 2025, arXiv 2503.14476); dual clip with
    c = clip_ratio_c: Ye et al. 2020 (arXiv 1912.09729; c = inf: none). Metrics: pg_clipfrac
    (clipped by either bound), pg_clipfrac_low (A < 0, r < 1-eps_lo), pg_clipfrac_high
    (A > 0, r > 1+eps_hi), pg_clipfrac_dual (A < 0, r > c), ppo_kl.

    response_mask None: every element counts (environment steps, any shape): the same loss
    averaged over all elements, without the masking and the per-side metrics (pg_clipfrac
    and ppo_kl only), which cost more than the math on small dense batches
    (benchmarks/rl/bench_ppo_loss.py).
    """
    if response_mask is None:
        return _dense_ppo_clip(old_log_prob, log_prob, advantages, config)
    old, new, adv, mask = _prepare(old_log_prob, log_prob, advantages, response_mask)
    lo, hi, c = 1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high, config.clip_ratio_c
    log_ratio = (new - old).clamp(-config.log_ratio_clamp, config.log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(lo, hi)
    loss_mat = torch.maximum(unclipped, clipped)
    dual = -adv * c
    neg = adv < 0
    loss_mat = torch.where(neg, torch.minimum(loss_mat, dual), loss_mat)
    loss = agg_loss(loss_mat, mask, config.loss_agg_mode, agg)
    with torch.no_grad():
        clip_low = neg & (ratio < lo)
        clip_high = (adv > 0) & (ratio > hi)
        metrics = _clip_metrics(clip_low, clip_high, log_ratio, mask)
        metrics["pg_clipfrac_dual"] = _frac(neg & (ratio > c), mask)
    return loss, metrics


def _dense_ppo_clip(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor,
                    config: PolicyLossConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """ppo_clip_loss where every element counts (its docstring)."""
    if config.loss_agg_mode != "token-mean":
        raise ValueError(f"a PPO clip loss without a response mask averages over every element (token-mean); "
                         f"loss_agg_mode={config.loss_agg_mode!r} needs the mask")
    lo, hi, c = 1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high, config.clip_ratio_c
    log_ratio = (log_prob - old_log_prob.detach()).clamp(-config.log_ratio_clamp, config.log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    adv = advantages.detach()
    loss_mat = torch.maximum(-adv * ratio, -adv * ratio.clamp(lo, hi))
    if math.isfinite(c):
        loss_mat = torch.where(adv < 0, torch.minimum(loss_mat, -adv * c), loss_mat)
    with torch.no_grad():
        clipped = ((adv < 0) & (ratio < lo)) | ((adv > 0) & (ratio > hi))
        metrics = {"pg_clipfrac": clipped.float().mean(), "ppo_kl": (-log_ratio).mean()}
    return loss_mat.mean(), metrics


@register_policy_loss("gspo")
def gspo_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    config: PolicyLossConfig,
    agg: AggregationScale | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO: l = max(-A s, -A clip(s, 1-eps_lo, 1+eps_hi)), s_i = exp(mean_t(log pi - log pi_old)).

    Zheng et al. 2025, "Group Sequence Policy Optimization" (arXiv 2507.18071), token form
    (GSPO-token): s_{i,t} = sg[s_i] * pi_t / sg[pi_t], whose value is s_i at every token
    and whose gradient is s_i grad log pi_t. With sequence-constant advantages and
    `seq-mean-token-mean` aggregation (the paper's setting) the gradient equals that of
    the sequence-level objective. Metrics: pg_clipfrac(_low/_high) per token, ppo_kl.
    """
    old, new, adv, mask = _prepare(old_log_prob, log_prob, advantages, response_mask)
    lo, hi = 1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high
    token_log_ratio = new - old
    seq_log_ratio = masked_mean(token_log_ratio, mask, dim=-1).unsqueeze(-1)
    log_s = seq_log_ratio.detach() + new - new.detach()
    log_s = log_s.clamp(-config.log_ratio_clamp, config.log_ratio_clamp)
    s = torch.exp(log_s)
    loss_mat = torch.maximum(-adv * s, -adv * s.clamp(lo, hi))
    loss = agg_loss(loss_mat, mask, config.loss_agg_mode, agg)
    with torch.no_grad():
        clip_low = (adv < 0) & (s < lo)
        clip_high = (adv > 0) & (s > hi)
        metrics = _clip_metrics(clip_low, clip_high, token_log_ratio, mask)
    return loss, metrics


@register_policy_loss("cispo")
def cispo_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    config: PolicyLossConfig,
    agg: AggregationScale | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO: l = -sg[clip(r, 1-eps_lo, 1+eps_hi)] A log pi.

    MiniMax 2025, "MiniMax-M1" (arXiv 2506.13585). The importance weight is clipped and
    detached, so every token keeps a gradient (sg[w] A grad log pi) instead of being
    dropped as in PPO. Metrics: pg_clipfrac(_low/_high) = weights clipped below/above,
    ppo_kl.
    """
    old, new, adv, mask = _prepare(old_log_prob, log_prob, advantages, response_mask)
    lo, hi = 1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high
    log_ratio = (new - old).clamp(-config.log_ratio_clamp, config.log_ratio_clamp)
    ratio = torch.exp(log_ratio).detach()
    weight = ratio.clamp(lo, hi)
    loss_mat = -weight * adv * new
    loss = agg_loss(loss_mat, mask, config.loss_agg_mode, agg)
    with torch.no_grad():
        clip_low, clip_high = ratio < lo, ratio > hi
        metrics = _clip_metrics(clip_low, clip_high, log_ratio, mask)
    return loss, metrics


@register_policy_loss("reinforce")
def reinforce_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    config: PolicyLossConfig,
    agg: AggregationScale | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """REINFORCE with importance weight: l = -A r, r = pi / pi_old (unclipped).

    Williams 1992. On-policy (r = 1) its gradient is -A grad log pi, the plain policy
    gradient; off-policy it is the unbiased importance-sampled estimate. Metrics: ppo_kl.
    """
    old, new, adv, mask = _prepare(old_log_prob, log_prob, advantages, response_mask)
    log_ratio = (new - old).clamp(-config.log_ratio_clamp, config.log_ratio_clamp)
    loss_mat = -adv * torch.exp(log_ratio)
    loss = agg_loss(loss_mat, mask, config.loss_agg_mode, agg)
    return loss, {"ppo_kl": _kl_metric(log_ratio.detach(), mask)}


@register_policy_loss("gpg")
def gpg_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    config: PolicyLossConfig,
    agg: AggregationScale | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GPG: l = -A log pi (no ratio, no clipping; the old policy only feeds the KL metric).

    Chu et al. 2025, "GPG" (arXiv 2504.02546): the policy-gradient objective optimised
    directly instead of a surrogate. Metrics: ppo_kl.
    """
    old, new, adv, mask = _prepare(old_log_prob, log_prob, advantages, response_mask)
    loss_mat = -adv * new
    loss = agg_loss(loss_mat, mask, config.loss_agg_mode, agg)
    return loss, {"ppo_kl": _kl_metric((new - old).detach(), mask)}
