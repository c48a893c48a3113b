"""RL algorithms as short programs over worker groups (HybridFlow paper, Figure 4).

Each function runs one step, top to bottom: generate -> reward -> old and reference
log-probs -> values -> advantages -> critic update -> actor update. The actor's new
weights reach the generation engine at the start of the next step's generate (weight
sync by resharding). `ALGORITHMS` maps every `algorithm.name` to its program; what a name
implies in the config (estimator, presets, checks) is its row of
`hybridflow.config.algorithm.ALGORITHM_SPECS`, and docs/algorithms.md lists both.

- critic_free: grpo, rloo, reinforce_plus_plus, reinforce_plus_plus_baseline, drgrpo; they
  differ only in the estimator and the presets (Dr.GRPO: no std, seq-mean-token-sum-norm).
- remax: one extra greedy response per prompt; its reward is the baseline.
- dapo: dynamic sampling (informative groups only, more prompts until the batch is full),
  overlong shaping; clip-higher and the token-mean loss are presets.
- ppo: GAE with a learned critic.
- safe_rlhf: PPO on reward and cost (two critics) under a Lagrange multiplier.

Any of them can take its reward from a reward model (`reward_model.path`) instead of, or
in addition to, the rule-based function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from hybridflow.algorithms import LagrangeMultiplier, build_kl_controller
from hybridflow.config.algorithm import overlong_buffer_len
from hybridflow.config.schema import RunConfig
from hybridflow.protocol import DataProto
from hybridflow.trainer import phases as P
from hybridflow.trainer.phases import Roles, Step


@dataclass
class AlgoState:
    """What lives across steps besides the models and the data position; checkpoints save
    it (`state_dict`) so a resumed run continues with the same coefficients."""

    kl_ctrl: Any  # hybridflow.algorithms Fixed/AdaptiveKLController, or None without KL in reward
    lagrange: LagrangeMultiplier | None = None  # Safe-RLHF's lambda, None for other algorithms

    def state_dict(self) -> dict[str, Any]:
        return {"kl_ctrl": self.kl_ctrl.state_dict() if self.kl_ctrl is not None else None,
                "lagrange": self.lagrange.state_dict() if self.lagrange is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state.get("kl_ctrl") is None) != (self.kl_ctrl is None):
            raise ValueError("the checkpoint's KL-in-reward setting differs from this run's "
                             "(algorithm.use_kl_in_reward); resume with the config the checkpoint was written with")
        # Checkpoints written before Safe-RLHF existed have no "lagrange" entry.
        if (state.get("lagrange") is None) != (self.lagrange is None):
            raise ValueError("the checkpoint's algorithm differs from this run's (one has a Safe-RLHF Lagrange "
                             "multiplier, the other not); resume with the config the checkpoint was written with")
        if self.kl_ctrl is not None:
            self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        if self.lagrange is not None:
            self.lagrange.load_state_dict(state["lagrange"])


def build_algo_state(cfg: RunConfig) -> AlgoState:
    """The cross-step state of `cfg.algorithm`, freshly initialised."""
    alg = cfg.algorithm
    kl = alg.kl_ctrl
    kl_ctrl = build_kl_controller(kl.type, kl.kl_coef, kl.target_kl, kl.horizon) if alg.use_kl_in_reward else None
    lagrange = None
    if alg.name == "safe_rlhf":
        s = alg.safe_rlhf
        lagrange = LagrangeMultiplier(s.lambda_init, s.lambda_lr, s.cost_limit, s.lambda_max)
    return AlgoState(kl_ctrl=kl_ctrl, lagrange=lagrange)


# ----------------------------------------------------------------------------- shared parts


def _rule_reward(roles: Roles, cfg: RunConfig) -> Any:
    """The rule-based reward manager, or None where the reward model replaces it."""
    return None if roles.reward_model is not None and not cfg.reward_model.add_rule_reward else roles.reward


def _score(batch: DataProto, roles: Roles, cfg: RunConfig) -> torch.Tensor:
    """Token-level scores of any generated batch, from the run's reward sources."""
    return P.score_sequences(batch, _rule_reward(roles, cfg), roles.reward_model)[0]


def _generate_and_score(step: Step, roles: Roles, cfg: RunConfig, round: int = 0) -> None:
    P.generate(step, roles.actor, cfg.rollout.n, round=round)
    P.compute_reward(step, _rule_reward(roles, cfg), roles.reward_model)


def _log_probs(step: Step, roles: Roles, cfg: RunConfig) -> None:
    P.compute_old_log_probs(step, roles.actor)
    if cfg.use_reference:
        P.compute_ref_log_probs(step, roles.actor)


def _shaped_rewards(step: Step, cfg: RunConfig, state: AlgoState) -> None:
    if cfg.algorithm.use_kl_in_reward:
        P.rewards_with_kl_penalty(step, state.kl_ctrl, cfg.algorithm.kl_penalty)
    else:
        P.rewards_are_scores(step)


def _train_actor_critic_free(step: Step, roles: Roles, cfg: RunConfig, state: AlgoState,
                             extra_keys: tuple[str, ...] = ()) -> None:
    """Everything after scoring for the critic-free programs."""
    _log_probs(step, roles, cfg)
    _shaped_rewards(step, cfg, state)
    P.compute_advantages(step, cfg.algorithm.estimator, cfg.algorithm.advantage_config(), extra_keys)
    P.update_actor(step, roles.actor, with_ref=cfg.actor.loss.use_kl_loss)


def _group_unit(cfg: RunConfig) -> int:
    """Fewest groups whose samples fill whole actor mini-batches (rollout.n samples a group)."""
    mini = cfg.actor.micro_batch.mini_batch_size
    return mini // math.gcd(mini, cfg.rollout.n)


# ----------------------------------------------------------------------------- programs


def critic_free(step: Step, roles: Roles, cfg: RunConfig, state: AlgoState) -> None:
    """GRPO (Shao et al. 2024), RLOO (Ahmadian et al. 2024), REINFORCE++ and its group-baseline
    variant (Hu 2025), Dr.GRPO (Liu et al. 2025): no critic; the advantage comes from the
    estimator of `algorithm.name` (group baselines, or batch-whitened returns)."""
    _generate_and_score(step, roles, cfg)
    _train_actor_critic_free(step, roles, cfg, state)


def remax(step: Step, roles: Roles, cfg: RunConfig, state: AlgoState) -> None:
    """ReMax (Li et al. 2023): advantage = reward - reward of the greedy response to the prompt."""
    prompts = step.batch
    _generate_and_score(step, roles, cfg)
    P.compute_greedy_baseline(step, prompts, roles.actor, lambda batch: _score(batch, roles, cfg))
    _train_actor_critic_free(step, roles, cfg, state, extra_keys=("baseline_rewards",))


def dapo(step: Step, roles: Roles, cfg: RunConfig, state: AlgoState) -> None:
    """DAPO (Yu et al. 2025): dynamic sampling, overlong reward shaping, clip-higher, token-mean loss."""
    d = cfg.algorithm.dapo
    if d.filter_groups.enable:
        P.sample_informative_groups(step, lambda part, r: _generate_and_score(part, roles, cfg, round=r),
                                    cfg.data.train_batch_size, d.filter_groups.max_extra_rounds, _group_unit(cfg))
    else:
        _generate_and_score(step, roles, cfg)
    if d.overlong_buffer.enable:
        P.add_overlong_penalty(step, cfg.rollout.response_length, overlong_buffer_len(cfg),
                               d.overlong_buffer.penalty_factor)
    _train_actor_critic_free(step, roles, cfg, state)


def ppo(step: Step, roles: Roles, cfg: RunConfig, state: AlgoState) -> None:
    """PPO (Schulman et al. 2017) with GAE advantages from a learned critic."""
    _generate_and_score(step, roles, cfg)
    _log_probs(step, roles, cfg)
    P.compute_values(step, roles.critic)
    _shaped_rewards(step, cfg, state)
    P.compute_advantages(step, "gae", cfg.algorithm.advantage_config())
    P.update_critic(step, roles.critic)
    P.update_actor(step, roles.actor, with_ref=cfg.actor.loss.use_kl_loss)


def safe_rlhf(step: Step, roles: Roles, cfg: RunConfig, state: AlgoState) -> None:
    """Safe-RLHF (Dai et al. 2023): PPO on reward and cost, each with its own critic; the
    multiplier lambda follows the mean episode cost against algorithm.safe_rlhf.cost_limit."""
    adv_config = cfg.algorithm.advantage_config()
    _generate_and_score(step, roles, cfg)
    P.compute_cost(step, roles.cost_fn, roles.cost_model)
    _log_probs(step, roles, cfg)
    P.compute_values(step, roles.critic)
    P.compute_cost_values(step, roles.cost_critic)
    _shaped_rewards(step, cfg, state)
    P.compute_advantages(step, "gae", adv_config)
    P.compute_safe_advantages(step, state.lagrange, adv_config)
    P.update_critic(step, roles.critic)
    P.update_cost_critic(step, roles.cost_critic)
    P.update_actor(step, roles.actor, with_ref=cfg.actor.loss.use_kl_loss)


ALGORITHMS: dict[str, Callable[[Step, Roles, RunConfig, AlgoState], None]] = {
    "grpo": critic_free,
    "rloo": critic_free,
    "reinforce_plus_plus": critic_free,
    "reinforce_plus_plus_baseline": critic_free,
    "drgrpo": critic_free,
    "remax": remax,
    "dapo": dapo,
    "ppo": ppo,
    "safe_rlhf": safe_rlhf,
}
