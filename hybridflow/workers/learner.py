"""`LearnerWorker`: the learner role of environment tasks, data-parallel over its ranks.

    learner = WorkerGroup(pool, LearnerWorker, learner_spec)     # distributed.num_learners ranks
    learner.init_model()                                          # process group, networks, optimizers
    metrics, weights = learner.ppo_update(batch)[0]               # PPO: batch split over the ranks
    metrics, weights = learner.sac_train(batch, 64)[0]            # SAC: store, then 64 gradient steps
    weights = learner.get_weights()                               # a future for the env runners (start, resume)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hybridflow.controller import Dispatch, Worker, register
from hybridflow.engines.policy.actor_critic import NetworkSpec
from hybridflow.engines.policy.ppo_learner import BATCH_KEYS, PPOLearner
from hybridflow.engines.policy.sac_learner import TRANSITION_KEYS, SACLearner
from hybridflow.engines.policy.weights import Weights, export_acting
from hybridflow.protocol import DataProto


@dataclass(frozen=True)
class LearnerSpec:
    """build(network, update, seed) makes one rank's learner (the algorithm's program names
    it: engines/policy build_ppo_learner, build_sac_learner); update: its per-rank settings."""

    build: Callable[[NetworkSpec, Any, int], PPOLearner | SACLearner]
    network: NetworkSpec
    seed: int
    update: Any


class LearnerWorker(Worker):
    def __init__(self, spec: LearnerSpec) -> None:
        if not isinstance(spec, LearnerSpec):
            raise TypeError(f"LearnerWorker needs a LearnerSpec, got {type(spec).__name__}")
        self.spec = spec
        self.learner: PPOLearner | SACLearner | None = None

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Join the learners' process group (several ranks) and build the networks."""
        spec = self.spec
        if self.world_size > 1:
            self.init_process_group()
        torch.manual_seed(spec.seed)  # the same initial weights on every rank
        self.learner = spec.build(spec.network, spec.update, spec.seed + self.rank)

    def _require(self) -> PPOLearner | SACLearner:
        if self.learner is None:
            raise RuntimeError("the learner is not built yet; call init_model() on the worker group first")
        return self.learner

    @register(dispatch=Dispatch.RANK_ZERO, blocking=False)
    def get_weights(self) -> Weights:
        """The acting weights as numpy arrays, for the runners' first collection (start, resume)."""
        return export_acting(self._require().model)

    def _new_weights(self) -> Weights | None:
        """What an update call returns beside its metrics: rank 0's acting weights (module docstring)."""
        return export_acting(self._require().model) if self.rank == 0 else None

    @register(dispatch=Dispatch.dp_compute_proto(pad=False))
    def ppo_update(self, data: DataProto) -> tuple[dict[str, float], Weights | None]:
        """PPO epochs on this rank's rows (meta_info["lr"]: the scheduled step size); the
        metrics and the new acting weights (rank 0; None on the others)."""
        learner = self._require()
        assert isinstance(learner, PPOLearner), "ppo_update on a SAC learner"
        metrics = learner.update({k: data.batch[k] for k in BATCH_KEYS}, lr=float(data.meta_info["lr"]))
        return metrics, self._new_weights()

    @register(dispatch=Dispatch.dp_compute_proto(pad=False))
    def sac_train(self, data: DataProto, num_steps: int) -> tuple[dict[str, float], Weights | None]:
        """Store this rank's share of the transitions in its replay shard, then `num_steps` SAC
        gradient steps (every rank samples from its own shard; 0: store only, and no weights
        back: they did not change). One call, not one to store and one to update: SAC
        iterates once per environment step, and on Ray each call is a round trip between
        processes. Returns the metrics and the new acting weights as ppo_update."""
        learner = self._require()
        assert isinstance(learner, SACLearner), "sac_train on a PPO learner"
        learner.add({k: data.batch[k] for k in TRANSITION_KEYS})
        if num_steps <= 0:
            return {}, None
        return learner.update(num_steps), self._new_weights()

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def save(self, directory: str) -> str:
        """Write this rank's learner state (network, optimizers, RNG, replay shard) into `directory`."""
        path = Path(directory) / f"rank{self.rank}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(self._require().state_dict(), tmp)
        os.replace(tmp, path)
        return str(path)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def load(self, directory: str) -> None:
        """Restore what `save` wrote (the same number of ranks)."""
        path = Path(directory) / f"rank{self.rank}.pt"
        if not path.is_file():
            raise FileNotFoundError(f"no learner state for rank {self.rank} at {str(path)!r}; resume with the "
                                    "distributed.num_learners the checkpoint was written with")
        # Imported here: the language-model engine's checkpoint module pulls in transformers and
        # torch.distributed.checkpoint (~3 s), which an environment learner needs only to resume.
        from hybridflow.engines.train.checkpoint import load_plain

        self._require().load_state_dict(load_plain(path))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def parameters_digest(self) -> dict[str, Any]:
        """Every rank's full model state as numpy (tests compare replicas and runs with it)."""
        return {k: v.detach().numpy().copy() for k, v in self._require().model.state_dict().items()}
