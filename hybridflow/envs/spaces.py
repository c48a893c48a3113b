"""Gymnasium spaces as the policies see them: `ActionSpec`s and flat float observations.

    spec = action_spec(env.action_space)       # Discrete, MultiDiscrete, MultiBinary, bounded Box
    encode = obs_encoder(env.observation_space)
    encode(obs) -> float32 [obs_dim]           # Box: flattened; Discrete: one-hot

Anything else raises a ValueError that says which wrapper makes the space usable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hybridflow.engines.policy.spaces import ActionSpec

ObsEncoder = Callable[[Any], np.ndarray]


def action_spec(space: Any) -> ActionSpec:
    """The `ActionSpec` of a Gymnasium action space."""
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        return ActionSpec("discrete", nvec=(int(space.n),), start=(int(space.start),))
    if isinstance(space, spaces.MultiDiscrete):
        if space.nvec.ndim != 1:
            raise ValueError(f"MultiDiscrete action spaces must be 1-D, got nvec of shape {space.nvec.shape}")
        return ActionSpec("multi_discrete", nvec=tuple(int(n) for n in space.nvec),
                          start=tuple(int(s) for s in space.start))
    if isinstance(space, spaces.MultiBinary):
        size = int(np.prod(space.shape))
        return ActionSpec("multi_discrete", nvec=(2,) * size, start=(0,) * size)
    if isinstance(space, spaces.Box):
        if len(space.shape) != 1:
            raise ValueError(f"Box action spaces must be 1-D, got shape {space.shape}; flatten the action with a wrapper")
        if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
            raise ValueError(f"the Box action space has unbounded dimensions (low {space.low}, high {space.high}); "
                             "policies squash actions into bounds: wrap the environment with "
                             "gymnasium.wrappers.RescaleAction or give the space finite bounds")
        return ActionSpec("box", low=tuple(float(x) for x in space.low), high=tuple(float(x) for x in space.high))
    raise ValueError(f"action space {space} is not supported; use Discrete, MultiDiscrete, MultiBinary or a bounded Box")


def obs_dim(space: Any) -> int:
    """Length of the flat observation vector."""
    from gymnasium import spaces

    if isinstance(space, spaces.Box):
        return int(np.prod(space.shape))
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    raise ValueError(f"observation space {space} is not supported; use a Box (vector observations) or Discrete "
                     "(one-hot encoded), e.g. with gymnasium.wrappers.FlattenObservation")


def obs_encoder(space: Any) -> ObsEncoder:
    """A function from one observation to a flat float32 vector of length `obs_dim(space)`."""
    from gymnasium import spaces

    dim = obs_dim(space)
    if isinstance(space, spaces.Discrete):
        start = int(space.start)

        def one_hot(obs: Any) -> np.ndarray:
            out = np.zeros(dim, dtype=np.float32)
            out[int(obs) - start] = 1.0
            return out

        return one_hot
    return lambda obs: np.asarray(obs, dtype=np.float32).reshape(dim)
