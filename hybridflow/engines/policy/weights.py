"""The weights an env runner acts with, as numpy arrays, out of a learner's model and into a runner's.

    weights = export_acting(learner_model)     # {"actor": {...}, "obs_norm": {...}} for SAC
    import_acting(runner_model, weights)        # strict: every tensor of those parts, nothing else

PPO runners need the whole `ActorCritic` (values for GAE come from the rollout); SAC runners
only the actor and the observation normaliser, a third of the model (the twin critics and
their targets stay on the learner). Numpy arrays travel zero-copy through Ray's object store.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from hybridflow.engines.policy.sac_model import SACModel

Weights = dict[str, dict[str, np.ndarray]]


def acting_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The parts of `model` that choose actions."""
    if isinstance(model, SACModel):
        return {"actor": model.actor, "obs_norm": model.obs_norm}
    return {"model": model}


def export_acting(model: nn.Module) -> Weights:
    return {name: {k: v.detach().numpy().copy() for k, v in part.state_dict().items()}
            for name, part in acting_modules(model).items()}


def import_acting(model: nn.Module, weights: Weights) -> None:
    parts = acting_modules(model)
    if set(weights) != set(parts):
        raise ValueError(f"weights hold parts {sorted(weights)}, this {type(model).__name__} acts with {sorted(parts)}")
    for name, part in parts.items():
        # torch.tensor copies: arrays from the object store are read-only.
        part.load_state_dict({k: torch.tensor(v) for k, v in weights[name].items()})
