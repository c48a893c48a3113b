"""RL algorithms as short programs over worker groups (HybridFlow paper, Figure 4)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from hybridflow.algorithms import LagrangeMultiplier, build_kl_controller
from hybridflow.algorithms.ppo_env import PPOLossConfig
from hybridflow.config.algorithm import AlgorithmSpec
from hybridflow.config.algorithm_settings import overlong_buffer_len
from hybridflow.config.schema import RunConfig
from hybridflow.engines.policy.actor_critic import ActorCritic
from hybridflow.engines.policy.ppo_learner import PPOUpdateConfig, build_ppo_learner
from hybridflow.engines.policy.sac_learner import TRANSITION_KEYS, SACUpdateConfig, build_sac_learner
from hybridflow.engines.policy.sac_model import SACModel
from hybridflow.registry import import_object
from hybridflow.rewards.templates import model_weight
from hybridflow.trainer.programs import env_phases as E
from hybridflow.trainer.programs import phases as P
from hybridflow.trainer.programs.phases import Roles, Step


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
    # A row with the lagrangian capability reads the multiplier's settings from its section.
    lagrange = alg.settings.multiplier() if alg.spec.lagrangian else None
    return AlgoState(kl_ctrl=kl_ctrl, lagrange=lagrange)


# A step program: one RL step over the worker groups, metrics into step.metrics.
Program = Callable[[Step, Roles, RunConfig, AlgoState], None]


def step_program(spec: AlgorithmSpec) -> Program:
    """The step function of a registry row: the function itself, or the one its
    "module:function" path names (the built-in rows name the functions below)."""
    if not isinstance(spec.program, str):
        return spec.program
    return import_object(spec.program, "algorithm.name", "program")


# ----------------------------------------------------------------------------- shared parts


def rule_reward_manager(roles: Roles, cfg: RunConfig) -> Any:
    """The rule-based reward manager, or None where the reward model replaces it (a
    reward.templates list naming reward_model keeps both: it composes them)."""
    replaced = not cfg.reward_model.add_rule_reward and model_weight(cfg.reward.templates) is None
    return None if roles.reward_model is not None and replaced else roles.reward


def reward_sources(roles: Roles, cfg: RunConfig) -> tuple[Any, Any, float]:
    """The run's reward sources, as P.score_sequences takes them: the rule-based manager
    (rule_reward_manager), the reward model, and its weight (its reward.templates entry's, else 1)."""
    weight = model_weight(cfg.reward.templates)
    return rule_reward_manager(roles, cfg), roles.reward_model, 1.0 if weight is None else weight


def generate_and_score(step: Step, roles: Roles, cfg: RunConfig, round: int = 0) -> None:
    """rollout.n responses per prompt and their token_level_scores from the run's reward sources."""
    P.generate(step, roles.actor, cfg.rollout.n, round=round)
    P.compute_reward(step, *reward_sources(roles, cfg))


def sample_groups(step: Step, roles: Roles, cfg: RunConfig) -> None:
    """generate_and_score, sampling again the prompts whose group scored all alike within the
    algorithm.exploration budget when it is on (P.explore_silent_groups)."""
    explore = cfg.algorithm.exploration
    if not explore.enabled:
        generate_and_score(step, roles, cfg)
        return
    P.explore_silent_groups(step, lambda part, r: generate_and_score(part, roles, cfg, round=r),
                            explore.max_extra_groups, explore.max_tries_per_prompt,
                            roles.actor.dp_parts("generate_sequences"))


def log_probs(step: Step, roles: Roles, cfg: RunConfig) -> None:
    """old_log_probs (unless the update computes them itself: RunConfig.fuses_old_log_probs),
    and ref_log_probs where the run uses the reference policy (KL): submitted together (one
    block, or part of the caller's), they run one after another in the actor's processes."""
    with P.concurrently(step):
        if not cfg.fuses_old_log_probs:
            P.compute_old_log_probs(step, roles.actor)
        if cfg.use_reference:
            P.compute_ref_log_probs(step, roles.actor)


def shaped_rewards(step: Step, cfg: RunConfig, state: AlgoState) -> None:
    """token_level_rewards: the scores, minus the KL penalty with algorithm.use_kl_in_reward."""
    if cfg.algorithm.use_kl_in_reward:
        P.rewards_with_kl_penalty(step, state.kl_ctrl, cfg.algorithm.kl_penalty)
    else:
        P.rewards_are_scores(step)


def train_critic_free(step: Step, roles: Roles, cfg: RunConfig, state: AlgoState,
                      extra_keys: tuple[str, ...] = ()) -> None:
    """Everything after scoring for the critic-free programs: log-probs, rewards, advantages
    of algorithm.adv_estimator (`extra_keys`: batch tensors it reads, e.g. baseline_rewards),
    actor update."""
    log_probs(step, roles, cfg)
    shaped_rewards(step, cfg, state)
    P.compute_advantages(step, cfg.algorithm.estimator, cfg.algorithm.advantage_config(), extra_keys)
    update_actor(step, roles, cfg)


def update_actor(step: Step, roles: Roles, cfg: RunConfig) -> None:
    """The actor's update, sent the batch keys the run's loss reads (the reference's log-probs
    for the KL loss, the behaviour policy's for the off-policy correction, the old ones unless
    the update computes them itself: RunConfig.fuses_old_log_probs, decided once)."""
    P.update_actor(step, roles.actor, with_ref=cfg.actor.loss.use_kl_loss,
                   with_behaviour=cfg.actor.loss.off_policy.enabled, with_old=not cfg.fuses_old_log_probs)


def group_unit(cfg: RunConfig) -> int:
    """Fewest groups whose samples fill whole actor mini-batches (rollout.n samples a group)."""
    mini = cfg.actor.micro_batch.mini_batch_size
    return mini // math.gcd(mini, cfg.rollout.n)


# ----------------------------------------------------------------------------- programs


def critic_free(step: Step, roles: Roles, cfg: RunConfig, state: AlgoState) -> None:
    """GRPO (Shao et al. 2024), RLOO (Ahmadian et al. 2024), REINFORCE++ and its group-baseline
    variant (Hu 2025), Dr.GRPO (Liu et al. 2025): no critic; the advantage comes from the
    estimator of `algorithm.name` (group baselines, or batch-whitened returns); the rows with
    the exploration capability sample silent groups again (sample_groups)."""
    sample_groups(step, roles, cfg)
    train_critic_free(step, roles, cfg, state)


def remax(step: Step, roles: Roles, cfg: RunConfig, state: AlgoState) -> None:
    """ReMax (Li et al. 2023): advantage = reward - reward of the greedy response to the prompt."""
    prompts = step.batch
    generate_and_score(step, roles, cfg)
    P.compute_greedy_baseline(step, prompts, roles.actor,
                              lambda batch: P.score_sequences(batch, *reward_sources(roles, cfg))[0])
    train_critic_free(step, roles, cfg, state, extra_keys=("baseline_rewards",))


def dapo(step: Step, roles: Roles, cfg: RunConfig, state: AlgoState) -> None:
    """DAPO (Yu et al. 2025): dynamic sampling, overlong reward shaping, clip-higher, token-mean loss."""
    d = cfg.algorithm.dapo
    overlong = (cfg.rollout.response_length, overlong_buffer_len(cfg), d.overlong_buffer.penalty_factor)
    shaped = d.overlong_buffer.enable and d.filter_groups.metric == "shaped_score"  # groups told apart after it

    def sample_round(part: Step, r: int) -> None:
        generate_and_score(part, roles, cfg, round=r)
        if shaped:
            P.add_overlong_penalty(part, *overlong)

    if d.filter_groups.enable:
        P.sample_informative_groups(step, sample_round, cfg.data.train_batch_size, d.filter_groups.max_extra_rounds,
                                    group_unit(cfg))
    else:
        sample_round(step, 0)
    if shaped:
        P.overlong_metrics(step, *overlong)  # of the groups trained on, not of the last round
    elif d.overlong_buffer.enable:
        P.add_overlong_penalty(step, *overlong)
    train_critic_free(step, roles, cfg, state)


def ppo(step: Step, roles: Roles, cfg: RunConfig, state: AlgoState) -> None:
    """PPO (Schulman et al. 2017) with GAE advantages from a learned critic."""
    generate_and_score(step, roles, cfg)
    with P.concurrently(step):  # the actor's log-probs beside the critic's values
        log_probs(step, roles, cfg)
        P.compute_values(step, roles.critic)
    shaped_rewards(step, cfg, state)
    P.compute_advantages(step, "gae", cfg.algorithm.advantage_config())
    with P.concurrently(step):  # the critic's update beside the actor's
        P.update_critic(step, roles.critic)
        update_actor(step, roles, cfg)


def safe_rlhf(step: Step, roles: Roles, cfg: RunConfig, state: AlgoState) -> None:
    """Safe-RLHF (Dai et al. 2023): PPO on reward and cost, each with its own critic; the
    multiplier lambda follows the mean episode cost against algorithm.safe_rlhf.cost_limit."""
    adv_config = cfg.algorithm.advantage_config()
    generate_and_score(step, roles, cfg)
    P.compute_cost(step, roles.cost_fn, roles.cost_model)
    with P.concurrently(step):  # the actor's log-probs beside the two critics' values
        log_probs(step, roles, cfg)
        P.compute_values(step, roles.critic)
        P.compute_cost_values(step, roles.cost_critic)
    shaped_rewards(step, cfg, state)
    P.compute_advantages(step, "gae", adv_config)
    P.compute_safe_advantages(step, state.lagrange, adv_config)
    with P.concurrently(step):  # the critics' updates beside the actor's
        P.update_critic(step, roles.critic)
        P.update_cost_critic(step, roles.cost_critic)
        update_actor(step, roles, cfg)



# ----------------------------------------------------------------------------- environment tasks


def env_ppo(step: Step, roles: Roles, cfg: Any, run: E.EnvRun) -> None:
    """PPO on environments: the runners collect, the controller computes GAE, the learner updates."""
    lr = E.ppo_lr(cfg, run)  # scheduled by the steps trained on before this batch
    E.collect(step, run, lambda: roles.runners.rollout(cfg.ppo.rollout_steps, *run.take_weights()))
    E.compute_env_gae(step, cfg.ppo, lr)
    E.update_learner(step, roles.learner, "ppo_update", run)


def env_sac(step: Step, roles: Roles, cfg: Any, run: E.EnvRun) -> None:
    """SAC: the runners collect transitions (uniform actions until sac.learning_starts steps were
    asked for), the learner stores them and takes its gradient steps."""
    s = cfg.sac
    E.collect(step, run, lambda: roles.runners.transitions(s.train_freq, run.submitted_steps < s.learning_starts,
                                                            *run.take_weights()), keep=TRANSITION_KEYS)
    if run.env_steps > s.learning_starts:
        steps = E.sac_gradient_steps(s.gradient_steps, s.train_freq, int(step.batch.meta_info["env_steps"]))
        E.update_learner(step, roles.learner, "sac_train", run, steps)
    else:
        E.store_transitions(step, roles.learner)  # warm-up: only fill the replay buffer


@dataclass(frozen=True)
class EnvProgram:
    """What an environment algorithm's row names: its step program, the network the runners
    act with, how each learner rank builds its learner, and that learner's per-rank settings
    from the algorithm's config section (`update_config(section, ranks)`)."""

    program: Callable[[Step, Roles, Any, E.EnvRun], None]
    acting_model: type
    build_learner: Callable[..., Any]
    update_config: Callable[[Any, int], Any]


def ppo_update_config(p: Any, ranks: int) -> PPOUpdateConfig:
    return PPOUpdateConfig(lr=p.lr, epochs=p.epochs, minibatch_size=p.minibatch_size // ranks,
                           max_grad_norm=p.max_grad_norm, target_kl=p.target_kl,
                           loss=PPOLossConfig(clip_ratio=p.clip_ratio, clip_value=p.clip_value, vf_coef=p.vf_coef,
                                              ent_coef=p.ent_coef, normalize_advantages=p.normalize_advantages))


def sac_update_config(s: Any, ranks: int) -> SACUpdateConfig:
    return SACUpdateConfig(lr=s.lr, batch_size=s.batch_size // ranks, gamma=s.gamma, tau=s.tau, autotune=s.autotune,
                           alpha=s.init_alpha, target_entropy=s.target_entropy,
                           buffer_capacity=max(1, s.buffer_size // ranks))


PPO = EnvProgram(env_ppo, ActorCritic, build_ppo_learner, ppo_update_config)
SAC = EnvProgram(env_sac, SACModel, build_sac_learner, sac_update_config)
