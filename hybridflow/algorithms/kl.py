"""KL estimators between the policy and the reference, KL in the reward and KL as a loss."""

from __future__ import annotations

from typing import Callable, Protocol

import torch

from hybridflow.algorithms.aggregation import AggregationScale, agg_loss
from hybridflow.registry import Registry
from hybridflow.algorithms.settings import KL_ESTIMATORS
from hybridflow.algorithms.stats import as_bool_mask, float_dtype, masked_mean

Tensor = torch.Tensor

# k3's exp(-delta) explodes for a token the reference finds far likelier than the policy;
# capping keeps one such token from dominating the batch (its gradient is then 0).
K3_MAX = 10.0


class KLEstimator(Protocol):
    def __call__(self, log_prob: Tensor, ref_log_prob: Tensor) -> Tensor: ...


_KL: Registry[KLEstimator] = KL_ESTIMATORS


def register_kl_estimator(name: str, *, override: bool = False) -> Callable[[KLEstimator], KLEstimator]:
    """Decorator: register `fn(log_prob, ref_log_prob) -> per-token kl` under `name`."""
    if name.endswith("+"):
        raise ValueError(f"KL estimator names may not end in '+' (reserved for straight-through): {name!r}")
    return _KL.register(name, override=override)


def get_kl_estimator(name: str) -> KLEstimator:
    """The estimator for `name` (without a trailing '+'); ValueError if unknown."""
    return _KL.get(name)


def kl_estimators() -> list[str]:
    """Registered base names; each also exists as a straight-through `<name>+`."""
    return _KL.names()


@register_kl_estimator("k1")
@register_kl_estimator("kl")
def kl_k1(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """k1 = log pi - log pi_ref."""
    return log_prob - ref_log_prob


@register_kl_estimator("abs")
def kl_abs(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """|log pi - log pi_ref|."""
    return (log_prob - ref_log_prob).abs()


@register_kl_estimator("k2")
@register_kl_estimator("mse")
def kl_k2(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """k2 = (log pi - log pi_ref)^2 / 2."""
    return 0.5 * (log_prob - ref_log_prob).square()


@register_kl_estimator("k3")
@register_kl_estimator("low_var_kl")
def kl_k3(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """k3 = exp(log pi_ref - log pi) - (log pi_ref - log pi) - 1, clamped to [0, K3_MAX]."""
    # Clamp the log-ratio first so exp cannot overflow to inf (inf - inf would be NaN).
    log_ratio = (ref_log_prob - log_prob).clamp(-20.0, 20.0)
    return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(0.0, K3_MAX)


def kl_penalty(log_prob: Tensor, ref_log_prob: Tensor, kl_type: str) -> Tensor:
    """Per-token KL estimate [B, T] of type `kl_type` (see module docstring; '+' = straight-through)."""
    if log_prob.shape != ref_log_prob.shape:
        raise ValueError(
            f"log_prob shape {tuple(log_prob.shape)} != ref_log_prob shape {tuple(ref_log_prob.shape)}"
        )
    if kl_type.endswith("+"):
        value = get_kl_estimator(kl_type[:-1])(log_prob, ref_log_prob)
        grad_path = kl_k2(log_prob, ref_log_prob)
        return value.detach() + (grad_path - grad_path.detach())
    return get_kl_estimator(kl_type)(log_prob, ref_log_prob)


def apply_kl_in_reward(
    token_level_scores: Tensor,
    old_log_prob: Tensor,
    ref_log_prob: Tensor,
    response_mask: Tensor,
    kl_ctrl: KLController,
    kl_type: str,
    *,
    update_controller: bool = True,
) -> tuple[Tensor, dict[str, float]]:
    """r_t = score_t - beta * kl_t on response tokens (beta = kl_ctrl.value before update).

    Ziegler et al. 2019 (arXiv 1909.08593), Ouyang et al. 2022. The batch KL reported and
    fed to `kl_ctrl.update(current_kl, n_steps=B)` is the mean over responses of each
    response's token-mean KL. Masked positions of the result are 0. Metrics:
    `kl_penalty` (that batch KL) and `kl_coef` (the beta used).
    """
    mask = as_bool_mask(response_mask, token_level_scores, "response_mask")
    with torch.no_grad():
        dtype = float_dtype(token_level_scores, old_log_prob, ref_log_prob)
        zero = torch.zeros((), dtype=dtype, device=token_level_scores.device)
        old = torch.where(mask, old_log_prob.to(dtype), zero)
        ref = torch.where(mask, ref_log_prob.to(dtype), zero)
        kl = torch.where(mask, kl_penalty(old, ref, kl_type), zero)
        beta = float(kl_ctrl.value)
        rewards = torch.where(mask, token_level_scores.to(dtype) - beta * kl, zero).to(token_level_scores.dtype)
        per_seq = masked_mean(kl, mask, dim=-1)
        current_kl = float(per_seq.mean()) if per_seq.numel() else 0.0
    if update_controller:
        kl_ctrl.update(current_kl, n_steps=token_level_scores.shape[0])
    return rewards, {"kl_penalty": current_kl, "kl_coef": beta}


def kl_loss(
    log_prob: Tensor,
    ref_log_prob: Tensor,
    response_mask: Tensor,
    *,
    kl_type: str,
    loss_agg_mode: str,
    agg: AggregationScale | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """KL as a loss term: agg(kl_type(log pi, log pi_ref)); the actor adds kl_loss_coef * this.

    GRPO (Shao et al. 2024) uses `low_var_kl`; prefer `k3+`/`low_var_kl+` for an unbiased
    gradient (module docstring). Metric: `kl_loss` (detached value).
    """
    mask = as_bool_mask(response_mask, log_prob, "response_mask")
    dtype = float_dtype(log_prob, ref_log_prob)
    zero = torch.zeros((), dtype=dtype, device=log_prob.device)
    new = torch.where(mask, log_prob.to(dtype), zero)
    ref = torch.where(mask, ref_log_prob.detach().to(dtype), zero)
    loss = agg_loss(kl_penalty(new, ref, kl_type), mask, loss_agg_mode, agg)
    return loss, {"kl_loss": loss.detach()}


class KLController(Protocol):
    """What `apply_kl_in_reward` needs from a KL controller (see controllers.py)."""

    @property
    def value(self) -> float: ...

    def update(self, current_kl: float, n_steps: int) -> None: ...
