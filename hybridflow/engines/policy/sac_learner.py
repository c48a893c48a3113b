"""`SACLearner`: replay buffer + SAC gradient steps on one learner rank (the learner worker wraps it).

    learner = SACLearner(SACModel(spec), sac_update_config, seed=0, capacity=100_000)
    learner.add(transitions)            # observations, actions ([-1, 1]), rewards, next_observations, terminated
    metrics = learner.update(num_steps)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from hybridflow.algorithms.replay import ReplayBuffer
from hybridflow.algorithms.sac import polyak_update, sac_actor_loss, sac_alpha_loss, sac_critic_loss, soft_q_target
from hybridflow.engines.policy.data_parallel import average_gradients, mean_over_ranks
from hybridflow.engines.policy.actor_critic import NetworkSpec
from hybridflow.engines.policy.sac_model import SACModel

Tensor = torch.Tensor
TRANSITION_KEYS = ("observations", "actions", "rewards", "next_observations", "terminated")


@dataclass(frozen=True)
class SACUpdateConfig:
    """batch_size: rows sampled per gradient step on this rank; alpha: the fixed temperature
    when not autotune (else its start value is the model's init_alpha); target_entropy:
    None means -action_dim. No defaults: the config's `sac` section holds them
    (trainer/env/specs.py builds this from it)."""

    lr: float
    batch_size: int
    gamma: float
    tau: float
    autotune: bool
    alpha: float
    target_entropy: float | None
    buffer_capacity: int  # transitions this rank's replay shard holds
    adam_eps: float = 1e-8


def build_sac_learner(network: NetworkSpec, config: SACUpdateConfig, seed: int) -> SACLearner:
    """The learner of one rank: a fresh SACModel (temperature starting at config.alpha)."""
    return SACLearner(SACModel(network, config.alpha), config, seed=seed, capacity=config.buffer_capacity)


class SACLearner:
    def __init__(self, model: SACModel, config: SACUpdateConfig, seed: int, capacity: int) -> None:
        self.model = model
        self.config = config
        adam = {"lr": config.lr, "eps": config.adam_eps, "fused": True}
        self.actor_opt = torch.optim.Adam(model.actor.parameters(), **adam)
        self.critic_opt = torch.optim.Adam(model.critic.parameters(), **adam)
        self.alpha_opt = torch.optim.Adam([model.log_alpha], **adam)
        if not config.autotune:
            with torch.no_grad():
                model.log_alpha.fill_(float(torch.log(torch.tensor(config.alpha))))
        action_dim = model.spec.action.dim
        self.target_entropy = -float(action_dim) if config.target_entropy is None else config.target_entropy
        obs = (model.spec.obs_dim,)
        self.buffer = ReplayBuffer(capacity, {"observations": obs, "actions": (action_dim,), "rewards": (),
                                              "next_observations": obs, "terminated": ()})
        self.generator = torch.Generator().manual_seed(seed)
        self.version = 0

    def add(self, transitions: Mapping[str, Tensor]) -> None:
        """Store transitions; the observation normaliser absorbs their observations."""
        self.buffer.add({k: transitions[k] for k in TRANSITION_KEYS})
        self.model.obs_norm.update(transitions["observations"])

    def update(self, num_steps: int) -> dict[str, float]:
        """`num_steps` gradient steps; metrics are means over them (and over ranks)."""
        if len(self.buffer) == 0:
            raise RuntimeError("SACLearner.update: the replay buffer is empty; add transitions first")
        sums: dict[str, Tensor] = {}
        for _ in range(num_steps):
            for key, value in self._step().items():
                sums[key] = sums.get(key, 0.0) + value
        self.version += 1
        out = mean_over_ranks({f"sac/{k}": float(v) / max(num_steps, 1) for k, v in sums.items()})
        out["sac/buffer_size"] = float(len(self.buffer))
        return out

    def _step(self) -> dict[str, Tensor]:
        cfg, model, gen = self.config, self.model, self.generator
        b = self.buffer.sample(cfg.batch_size, gen)
        obs, next_obs = model.obs_norm(b["observations"]), model.obs_norm(b["next_observations"])
        pi_actions, log_probs = model.actor.sample(obs, gen)
        metrics: dict[str, Tensor] = {}
        if cfg.autotune:
            alpha_loss = sac_alpha_loss(model.log_alpha, log_probs, self.target_entropy)
            self._step_optimizer(self.alpha_opt, alpha_loss, [model.log_alpha])
            metrics["alpha_loss"] = alpha_loss.detach()
        alpha = model.log_alpha.detach().exp()

        with torch.no_grad():
            next_actions, next_log_probs = model.actor.sample(next_obs, gen)
            next_q1, next_q2 = model.critic_target(next_obs, next_actions)
            target = soft_q_target(b["rewards"], b["terminated"], next_q1, next_q2, next_log_probs,
                                   alpha=alpha, gamma=cfg.gamma)
        q1, q2 = model.critic(obs, b["actions"])
        critic_loss = sac_critic_loss(q1, q2, target)
        self._step_optimizer(self.critic_opt, critic_loss, list(model.critic.parameters()))

        model.critic.requires_grad_(False)  # the actor's loss must not leave gradients in the critics
        try:
            q1_pi, q2_pi = model.critic(obs, pi_actions)
            actor_loss = sac_actor_loss(q1_pi, q2_pi, log_probs, alpha)
            self._step_optimizer(self.actor_opt, actor_loss, list(model.actor.parameters()))
        finally:
            model.critic.requires_grad_(True)
        polyak_update(model.critic_target.parameters(), model.critic.parameters(), cfg.tau)
        metrics.update({"critic_loss": critic_loss.detach(), "actor_loss": actor_loss.detach(), "alpha": alpha,
                        "q_mean": q1.detach().mean(), "entropy": -log_probs.detach().mean()})
        return metrics

    @staticmethod
    def _step_optimizer(optimizer: torch.optim.Optimizer, loss: Tensor, params: list[torch.nn.Parameter]) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        average_gradients(params)
        optimizer.step()

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "actor_opt": self.actor_opt.state_dict(),
                "critic_opt": self.critic_opt.state_dict(), "alpha_opt": self.alpha_opt.state_dict(),
                "buffer": self.buffer.state_dict(), "generator": self.generator.get_state(), "version": self.version}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        self.alpha_opt.load_state_dict(state["alpha_opt"])
        self.buffer.load_state_dict(state["buffer"])
        self.generator.set_state(state["generator"])
        self.version = int(state["version"])
