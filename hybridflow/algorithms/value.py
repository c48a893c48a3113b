"""Critic loss: clipped value regression (config `critic.cliprange_value`, `critic.loss_agg_mode`).

l_t = 1/2 max((V_t - R_t)^2, (V_old,t + clip(V_t - V_old,t, -c, c) - R_t)^2)
(Schulman et al. 2017, PPO, arXiv 1707.06347; the clipped value target as in OpenAI
baselines). The max makes clipping pessimistic: a prediction that moved more than c
away from the old value only gets gradient when that also moves it away from the return.
"""

from __future__ import annotations

import torch

from hybridflow.algorithms.aggregation import AggregationScale, agg_loss
from hybridflow.algorithms.stats import as_bool_mask, float_dtype, masked_mean

Tensor = torch.Tensor


def value_loss(
    vpreds: Tensor,
    values: Tensor,
    returns: Tensor,
    response_mask: Tensor,
    *,
    cliprange_value: float | None,
    loss_agg_mode: str = "token-mean",
    agg: AggregationScale | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss (module docstring); `cliprange_value=None` disables clipping.

    vpreds: current critic output; values: critic output at rollout time (V_old);
    returns: regression targets. Metrics: vf_clipfrac (tokens where the clipped term is
    larger), vpred_mean.
    """
    if vpreds.dim() != 2:
        raise ValueError(f"vpreds must be [B, T], got shape {tuple(vpreds.shape)}")
    for name, t in (("values", values), ("returns", returns)):
        if t.shape != vpreds.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != vpreds shape {tuple(vpreds.shape)}")
    if cliprange_value is not None and not cliprange_value > 0:
        raise ValueError(f"cliprange_value must be > 0 or None, got {cliprange_value}")
    mask = as_bool_mask(response_mask, vpreds, "response_mask")
    dtype = float_dtype(vpreds, values, returns)
    zero = torch.zeros((), dtype=dtype, device=vpreds.device)
    v = torch.where(mask, vpreds.to(dtype), zero)
    v_old = torch.where(mask, values.detach().to(dtype), zero)
    ret = torch.where(mask, returns.detach().to(dtype), zero)
    unclipped = (v - ret).square()
    if cliprange_value is None:
        loss_mat = unclipped
        clipped_more = torch.zeros_like(mask)
    else:
        v_clipped = v_old + (v - v_old).clamp(-cliprange_value, cliprange_value)
        clipped = (v_clipped - ret).square()
        loss_mat = torch.maximum(unclipped, clipped)
        clipped_more = clipped > unclipped
    loss = 0.5 * agg_loss(loss_mat, mask, loss_agg_mode, agg)
    metrics = {
        "vf_clipfrac": masked_mean(clipped_more.to(torch.float32), mask).detach(),
        "vpred_mean": masked_mean(v, mask).detach(),
    }
    return loss, metrics
