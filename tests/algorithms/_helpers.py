"""Shared test helpers: hypothesis settings and batch builders for the algorithms tests."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import HealthCheck, settings

# Derandomized so CI runs are reproducible; few examples keep tests/algorithms well under
# a minute on a 2-core machine.
FAST = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def mask_from_lengths(lengths: list[int], width: int) -> torch.Tensor:
    """[B, width] bool mask with the first lengths[i] positions of row i kept."""
    return torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)


def outcome_rewards(scores: list[float] | np.ndarray, mask: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """Token rewards with each score on the last kept token of its row (0 elsewhere)."""
    rewards = torch.zeros(mask.shape, dtype=dtype)
    for i, s in enumerate(scores):
        kept = torch.nonzero(mask[i]).flatten()
        if len(kept):
            rewards[i, kept[-1]] = float(s)
    return rewards


def poison_masked(x: torch.Tensor, mask: torch.Tensor, seed: int, nan: bool = False) -> torch.Tensor:
    """x with every masked position replaced by large random garbage (or NaN)."""
    g = torch.Generator().manual_seed(seed)
    junk = torch.full_like(x, float("nan")) if nan else torch.randn(x.shape, generator=g, dtype=x.dtype) * 1e3
    return torch.where(mask, x, junk)
