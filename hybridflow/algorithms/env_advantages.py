"""GAE over environment rollouts: rows are environments, columns are time steps."""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def compute_env_gae(rewards: Tensor, values: Tensor, next_values: Tensor, terminated: Tensor, dones: Tensor,
                    *, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """(advantages, returns), both [N, T] like `rewards` (see the module docstring)."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [num_envs, T], got shape {tuple(rewards.shape)}")
    for name, t in (("values", values), ("next_values", next_values), ("terminated", terminated),
                    ("dones", dones)):
        if t.shape != rewards.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != rewards shape {tuple(rewards.shape)}")
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lam must be in [0, 1], got gamma={gamma}, lam={lam}")
    with torch.no_grad():
        dtype = torch.promote_types(rewards.dtype, torch.float32)
        r, v, nv = rewards.to(dtype), values.to(dtype), next_values.to(dtype)
        alive = 1.0 - terminated.to(dtype)
        carry = 1.0 - dones.to(dtype)
        deltas = r + gamma * alive * nv - v
        adv = torch.zeros_like(r)
        running = torch.zeros_like(r[:, 0])
        for t in range(r.shape[1] - 1, -1, -1):
            running = deltas[:, t] + gamma * lam * carry[:, t] * running
            adv[:, t] = running
    return adv, adv + v
