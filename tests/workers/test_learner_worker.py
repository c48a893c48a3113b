"""The environment learner's update calls return the new acting weights with their metrics
(workers/learner.py), so an iteration needs no get_weights call of its own: they must be
the weights after the update, the ones get_weights would have exported."""

from __future__ import annotations

import numpy as np
import torch

from hybridflow.algorithms.ppo_env import PPOLossConfig
from hybridflow.controller import IN_PROCESS, WorkerGroup
from hybridflow.engines.policy.actor_critic import NetworkSpec
from hybridflow.engines.policy.ppo_learner import PPOUpdateConfig, build_ppo_learner
from hybridflow.engines.policy.spaces import ActionSpec
from hybridflow.protocol import DataProto
from hybridflow.workers.learner import LearnerSpec, LearnerWorker


def _batch(rows: int) -> DataProto:
    g = torch.Generator().manual_seed(1)
    return DataProto.from_dict({
        "observations": torch.randn(rows, 4, generator=g), "actions": torch.randint(0, 2, (rows, 1), generator=g),
        "old_log_probs": -torch.rand(rows, generator=g), "values": torch.randn(rows, generator=g),
        "advantages": torch.randn(rows, generator=g), "returns": torch.randn(rows, generator=g)},
        meta_info={"lr": 1e-2})


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[p].keys() == b[p].keys() and all(np.array_equal(a[p][k], b[p][k]) for k in a[p]) for p in a)


def test_ppo_update_returns_the_weights_after_the_update():
    spec = LearnerSpec(build=build_ppo_learner, seed=0,
                       network=NetworkSpec(obs_dim=4, action=ActionSpec("discrete", (2,)), hidden_size=(8,)),
                       update=PPOUpdateConfig(lr=1e-2, epochs=2, minibatch_size=16, max_grad_norm=0.5, target_kl=None,
                                              loss=PPOLossConfig()))
    learner = WorkerGroup(IN_PROCESS, LearnerWorker, spec)
    learner.init_model()
    before = learner.get_weights().get()
    metrics, weights = learner.ppo_update(_batch(32))[0]
    assert metrics["ppo/minibatch_steps"] == 4.0
    assert _same(weights, learner.get_weights().get())  # what a get_weights call would send
    assert not _same(weights, before)  # the update's weights, not the ones it started from
