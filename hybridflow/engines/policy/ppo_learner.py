"""`PPOLearner`: minibatch epochs of PPO on one learner rank (no processes; the learner worker wraps it).

    learner = PPOLearner(ActorCritic(spec), ppo_update_config, seed=0)
    metrics = learner.update(batch, lr=3e-4)       # batch: per step obs, actions, old_log_probs, values, advantages, returns
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from hybridflow.algorithms.ppo_env import PPOLossConfig, actor_critic_loss
from hybridflow.engines.policy.actor_critic import ActorCritic, NetworkSpec
from hybridflow.engines.policy.data_parallel import average_gradients, global_mean_std, mean_over_ranks

Tensor = torch.Tensor
BATCH_KEYS = ("observations", "actions", "old_log_probs", "values", "advantages", "returns")


@dataclass(frozen=True)
class PPOUpdateConfig:
    """lr: Adam step size at the start (the caller passes the scheduled one to `update`);
    minibatch_size: rows per optimizer step on this rank; target_kl: stop the epochs early
    once an epoch's mean approx KL exceeds it (None: never). No defaults: the config's
    `ppo` section holds them (trainer/env/specs.py builds this from it)."""

    lr: float
    epochs: int
    minibatch_size: int
    max_grad_norm: float | None
    target_kl: float | None
    loss: PPOLossConfig
    adam_eps: float = 1e-5


def build_ppo_learner(network: NetworkSpec, config: PPOUpdateConfig, seed: int) -> PPOLearner:
    """The learner of one rank: a fresh ActorCritic."""
    return PPOLearner(ActorCritic(network), config, seed=seed)


class PPOLearner:
    def __init__(self, model: ActorCritic, config: PPOUpdateConfig, seed: int) -> None:
        self.model = model
        self.config = config
        # Listed once: model.parameters() walks the module tree (a set of seen tensors, a hash
        # per parameter), ~5% of a small network's minibatch step when asked every step.
        self.params = list(model.parameters())
        self.optimizer = torch.optim.Adam(self.params, lr=config.lr, eps=config.adam_eps, fused=True)
        self.generator = torch.Generator().manual_seed(seed)
        self.version = 0  # optimizer rounds done: the policy version the runners act with

    def update(self, batch: Mapping[str, Tensor], lr: float) -> dict[str, float]:
        """PPO epochs over `batch`; returns metrics averaged over minibatches and ranks."""
        cfg = self.config
        missing = [k for k in BATCH_KEYS if k not in batch]
        if missing:
            raise KeyError(f"PPOLearner.update needs {missing}; the batch has {sorted(batch)}")
        n = len(batch["observations"])
        if n % cfg.minibatch_size:
            raise ValueError(f"PPOLearner.update: {n} rows do not split into minibatches of {cfg.minibatch_size}")
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        sums: dict[str, Tensor] = {}
        steps, epochs_done = 0, 0
        for _ in range(cfg.epochs):
            order = torch.randperm(n, generator=self.generator)
            epoch_kl = torch.zeros((), dtype=torch.float64)
            for start in range(0, n, cfg.minibatch_size):
                metrics = self._minibatch(batch, order[start:start + cfg.minibatch_size])
                epoch_kl += metrics["approx_kl"]
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + value
                steps += 1
            epochs_done += 1
            if cfg.target_kl is not None:
                kl = mean_over_ranks({"kl": float(epoch_kl) / (n // cfg.minibatch_size)})["kl"]
                if kl > cfg.target_kl:
                    break
        self.model.obs_norm.update(batch["observations"])
        self.version += 1
        out = {f"ppo/{k}": float(v) / steps for k, v in sums.items()}
        out["ppo/explained_variance"] = explained_variance(batch["values"], batch["returns"])
        out = mean_over_ranks(out)
        out.update({"ppo/lr": lr, "ppo/epochs": float(epochs_done), "ppo/minibatch_steps": float(steps)})
        return out

    def _minibatch(self, batch: Mapping[str, Tensor], rows: Tensor) -> dict[str, Tensor]:
        cfg = self.config
        adv = batch["advantages"][rows]
        log_probs, entropy, values = self.model.evaluate(batch["observations"][rows], batch["actions"][rows])
        stats = global_mean_std(adv) if cfg.loss.normalize_advantages else None
        loss, metrics = actor_critic_loss(log_probs, batch["old_log_probs"][rows], adv, values, batch["values"][rows],
                                 batch["returns"][rows], entropy, cfg.loss, adv_mean_std=stats)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        params = [p for p in self.params if p.grad is not None]
        average_gradients(params)
        if cfg.max_grad_norm is not None:
            metrics["grad_norm"] = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm, foreach=True).detach()
        self.optimizer.step()
        metrics["loss"] = loss.detach()
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "generator": self.generator.get_state(), "version": self.version}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.version = int(state["version"])


def explained_variance(values: Tensor, returns: Tensor) -> float:
    """1 - Var(returns - values) / Var(returns): 1 is a perfect value function, <= 0 none."""
    var = returns.double().var()
    if var == 0:
        return float("nan")
    return float(1.0 - (returns.double() - values.double()).var() / var)
