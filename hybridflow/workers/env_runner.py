"""`EnvRunnerWorker`: one env-runner process (a vector of environments and an acting policy).

    runners = WorkerGroup(pool, EnvRunnerWorker, collector_spec)     # distributed.num_workers ranks
    segment = runners.rollout(128, learner.get_weights(), version).get()   # PPO: every rank's rows
    transitions = runners.transitions(1, False, None, None).get()       # SAC, with the weights it has
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hybridflow.controller import Dispatch, DispatchContext, Worker, register, register_dispatch_mode
from hybridflow.controller.dispatch import split_one_to_all
from hybridflow.engines.policy.weights import Weights
from hybridflow.envs.collector import Collector, CollectorSpec
from hybridflow.protocol import DataProto

RANK_SEED_STRIDE = 1000


def collect_segments(ctx: DispatchContext, outputs: list[DataProto]) -> DataProto:
    """Every runner's rows in rank order; episode lists joined and env steps summed."""
    returns: list[float] = []
    lengths: list[int] = []
    steps = 0
    parts = []
    for out in outputs:
        meta = out.meta_info
        returns += meta["episode_returns"]
        lengths += meta["episode_lengths"]
        steps += meta["env_steps"]
        parts.append(DataProto(batch=out.batch))
    merged = DataProto.concat(parts) if len(parts) > 1 else parts[0]
    merged.meta_info = {"episode_returns": returns, "episode_lengths": lengths, "env_steps": steps}
    return merged


ENV_SEGMENTS = register_dispatch_mode("ENV_SEGMENTS", split_one_to_all, collect_segments)


class EnvRunnerWorker(Worker):
    """A `Collector` in one process; its rank picks its seeds."""

    def __init__(self, spec: CollectorSpec) -> None:
        if not isinstance(spec, CollectorSpec):
            raise TypeError(f"EnvRunnerWorker needs a CollectorSpec, got {type(spec).__name__}")
        self.collector = Collector(dataclasses.replace(spec, seed=spec.seed + RANK_SEED_STRIDE * self.rank))

    def _take(self, weights: Weights | None, version: int | None) -> None:
        if weights is not None:  # None: keep acting with the weights loaded last
            self.collector.set_weights(weights, int(version))

    @register(dispatch=ENV_SEGMENTS, blocking=False)
    def rollout(self, steps: int, weights: Weights | None, version: int | None) -> DataProto:
        """PPO segments: `steps` steps of every environment copy (collector.py), acting with
        `weights` (the learner's policy `version`) when given."""
        self._take(weights, version)
        return self.collector.rollout(steps)

    @register(dispatch=ENV_SEGMENTS, blocking=False)
    def transitions(self, steps: int, random: bool, weights: Weights | None, version: int | None) -> DataProto:
        """SAC transitions: `steps` steps of every copy, uniform actions when `random`;
        `weights` as for `rollout`."""
        self._take(weights, version)
        return self.collector.transitions(steps, random)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def close_envs(self) -> None:
        """Close every environment copy (a window, a file, a simulator process of its own)
        before the worker goes: killing its process or dropping it would skip env.close()."""
        self.collector.venv.close()

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def state_dict(self) -> dict[str, Any]:
        """Environments, observations, RNG and reward scaling of this rank (for checkpoints)."""
        return self.collector.state_dict()

    @register(dispatch=Dispatch.ALL_TO_ALL)
    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore this rank's `state_dict` (one per rank); False if its environments restarted."""
        return self.collector.load_state_dict(state)
