"""RL algorithms as short programs over worker groups (HybridFlow paper, Figure 4).

Each function runs one step, top to bottom: generate -> reward -> old and reference
log-probs -> values -> advantages -> critic update -> actor update. The actor's new
weights reach the generation engine at the start of the next step's generate (weight
sync by resharding). PPO and GRPO differ in a few lines: PPO asks the critic for values,
uses GAE, and updates the critic; GRPO uses the group of samples of each prompt as the
baseline instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from hybridflow.algorithms import build_kl_controller
from hybridflow.config.schema import RunConfig
from hybridflow.trainer import phases as P
from hybridflow.trainer.phases import Roles, Step


@dataclass
class AlgoState:
    """What lives across steps besides the models and the data position; checkpoints save
    it (`state_dict`) so a resumed run continues with the same coefficients."""

    kl_ctrl: Any  # hybridflow.algorithms Fixed/AdaptiveKLController, or None without KL in reward

    def state_dict(self) -> dict[str, Any]:
        return {"kl_ctrl": self.kl_ctrl.state_dict() if self.kl_ctrl is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state.get("kl_ctrl") is None) != (self.kl_ctrl is None):
            raise ValueError("the checkpoint's KL-in-reward setting differs from this run's "
                             "(algorithm.use_kl_in_reward); resume with the config the checkpoint was written with")
        if self.kl_ctrl is not None:
            self.kl_ctrl.load_state_dict(state["kl_ctrl"])


def build_algo_state(cfg: RunConfig) -> AlgoState:
    """The cross-step state of `cfg.algorithm`, freshly initialised."""
    kl = cfg.algorithm.kl_ctrl
    kl_ctrl = (build_kl_controller(kl.type, kl.kl_coef, kl.target_kl, kl.horizon)
               if cfg.algorithm.use_kl_in_reward else None)
    return AlgoState(kl_ctrl=kl_ctrl)


def _shaped_rewards(step: Step, cfg: RunConfig, state: AlgoState) -> None:
    if cfg.algorithm.use_kl_in_reward:
        P.rewards_with_kl_penalty(step, state.kl_ctrl, cfg.algorithm.kl_penalty)
    else:
        P.rewards_are_scores(step)


def grpo(step: Step, roles: Roles, cfg: RunConfig, state: AlgoState) -> None:
    """GRPO (Shao et al. 2024): critic-free, advantage = score standardised within its group."""
    P.generate(step, roles.actor, cfg.rollout.n)
    P.compute_reward(step, roles.reward)
    P.compute_old_log_probs(step, roles.actor)
    if cfg.use_reference:
        P.compute_ref_log_probs(step, roles.actor)
    _shaped_rewards(step, cfg, state)
    P.compute_advantages(step, cfg.algorithm.estimator, cfg.algorithm.advantage_config())
    P.update_actor(step, roles.actor, with_ref=cfg.actor.loss.use_kl_loss)


def ppo(step: Step, roles: Roles, cfg: RunConfig, state: AlgoState) -> None:
    """PPO (Schulman et al. 2017) with GAE advantages from a learned critic."""
    P.generate(step, roles.actor, cfg.rollout.n)
    P.compute_reward(step, roles.reward)
    P.compute_old_log_probs(step, roles.actor)
    if cfg.use_reference:
        P.compute_ref_log_probs(step, roles.actor)
    P.compute_values(step, roles.critic)
    _shaped_rewards(step, cfg, state)
    P.compute_advantages(step, "gae", cfg.algorithm.advantage_config())
    P.update_critic(step, roles.critic)
    P.update_actor(step, roles.actor, with_ref=cfg.actor.loss.use_kl_loss)


ALGORITHMS: dict[str, Callable[[Step, Roles, RunConfig, AlgoState], None]] = {"grpo": grpo, "ppo": ppo}
