"""hybridflow.algorithms: the RL math layer (pure torch; no processes, no models).

Advantage estimators, policy and value losses, KL estimators and controllers, loss
aggregation, masked statistics, log-prob/entropy from logits, DAPO and Safe-RLHF pieces,
and the Bradley-Terry reward-model loss.
Estimators, policy losses, aggregation modes and KL estimators are registries keyed by
the names verl users know, so the trainer picks them from config and users can add their
own. See docs/algorithms.md for every name, its formula and its config key.
"""

from __future__ import annotations

from hybridflow.algorithms import group_advantages as _group_advantages  # noqa: F401  (registers)
from hybridflow.algorithms.advantages import (
    AdvantageConfig,
    adv_estimators,
    compute_advantage,
    compute_gae,
    compute_reinforce_plus_plus,
    compute_remax,
    get_adv_estimator,
    register_adv_estimator,
)
from hybridflow.algorithms.aggregation import (
    AggregationScale,
    agg_loss,
    compute_aggregation_scale,
    get_loss_agg_mode,
    loss_agg_modes,
    register_loss_agg_mode,
    torch_all_reduce_sum,
)
from hybridflow.algorithms.controllers import AdaptiveKLController, FixedKLController, build_kl_controller
from hybridflow.algorithms.dapo import dynamic_sampling_filter, overlong_reward_penalty
from hybridflow.algorithms.group_advantages import (
    compute_gpg,
    compute_grpo,
    compute_grpo_passk,
    compute_opo,
    compute_reinforce_plus_plus_baseline,
    compute_rloo,
)
from hybridflow.algorithms.kl import (
    apply_kl_in_reward,
    get_kl_estimator,
    kl_estimators,
    kl_loss,
    kl_penalty,
    register_kl_estimator,
)
from hybridflow.algorithms.logprob import entropy_from_logits, logprobs_from_logits
from hybridflow.algorithms.policy_loss import (
    PolicyLossConfig,
    compute_policy_loss,
    get_policy_loss,
    policy_losses,
    register_policy_loss,
)
from hybridflow.algorithms.registry import Registry
from hybridflow.algorithms.reward_loss import bradley_terry_loss, pairwise_accuracy
from hybridflow.algorithms.safe_rlhf import (
    LagrangeMultiplier,
    combine_reward_cost_advantages,
    compute_cost_advantages,
)
from hybridflow.algorithms.stats import masked_mean, masked_sum, masked_var, masked_whiten
from hybridflow.algorithms.value import value_loss

__all__ = [
    "AdaptiveKLController",
    "AdvantageConfig",
    "AggregationScale",
    "FixedKLController",
    "LagrangeMultiplier",
    "PolicyLossConfig",
    "Registry",
    "adv_estimators",
    "agg_loss",
    "apply_kl_in_reward",
    "bradley_terry_loss",
    "build_kl_controller",
    "combine_reward_cost_advantages",
    "compute_advantage",
    "compute_aggregation_scale",
    "compute_cost_advantages",
    "compute_gae",
    "compute_gpg",
    "compute_grpo",
    "compute_grpo_passk",
    "compute_opo",
    "compute_policy_loss",
    "compute_reinforce_plus_plus",
    "compute_reinforce_plus_plus_baseline",
    "compute_remax",
    "compute_rloo",
    "dynamic_sampling_filter",
    "entropy_from_logits",
    "get_adv_estimator",
    "get_kl_estimator",
    "get_loss_agg_mode",
    "get_policy_loss",
    "kl_estimators",
    "kl_loss",
    "kl_penalty",
    "logprobs_from_logits",
    "loss_agg_modes",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "overlong_reward_penalty",
    "pairwise_accuracy",
    "policy_losses",
    "register_adv_estimator",
    "register_kl_estimator",
    "register_loss_agg_mode",
    "register_policy_loss",
    "torch_all_reduce_sum",
    "value_loss",
]
