"""GAE over environment rollouts: rows are environments, columns are time steps.

An LM response is one episode per row that ends after its last token (`compute_gae` in
advantages.py: V = 0 past the end). An environment row of T steps holds several episodes
back to back, and an episode can end two ways:

- terminated (a terminal state): nothing follows, the next value is 0;
- truncated (a time limit, or the end of the rollout segment): the episode would go on,
  so the return bootstraps from V(s_{t+1}) of the state the environment stopped in.

With next_values[t] = V(s_{t+1}) (the final observation's value at a truncation):

    delta_t = r_t + gamma * (1 - terminated_t) * next_values_t - V(s_t)
    A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1}      (done = terminated or truncated)
    R_t     = A_t + V(s_t)

The last column continues into the next segment, so A_{T} = 0 there and the bootstrap
comes through next_values. For a row that is one episode terminating at its last step this
is exactly `compute_gae` (tests/algorithms/test_env_advantages.py checks that).
"""

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
