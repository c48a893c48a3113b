"""An algorithm defined outside the hybridflow package: "grpo_brevity", GRPO that prefers
short answers.

    hybridflow train --config examples/custom_algorithm/grpo_brevity.yaml   # from the repo root

The YAML names this file in `algorithm.module`; the config loader imports it before it
looks up `algorithm.name`, and the `@register_algorithm` below registers everything the
name implies (its spec row) together with its step program. From Python, importing this
module before building the RunConfig does the same (docs/extending.md, "Add an algorithm").

The program is the GRPO step with one extra phase: each response's score loses
BREVITY_COEF x (its length / rollout.response_length), so among equally good answers the
shorter ones get the larger advantage. Metrics: brevity/penalty_mean (the mean penalty)
and brevity/task_score_mean (the mean score before it).
"""

from __future__ import annotations

from hybridflow.config import ConfigError
from hybridflow.config.algorithm import AlgorithmSpec, register_algorithm
from hybridflow.config.schema import RunConfig
from hybridflow.trainer.programs import phases as P
from hybridflow.trainer.programs.algorithms import AlgoState, generate_and_score, train_critic_free
from hybridflow.workers.reward_model import scores_at_last_response_token

# Largest penalty, paid by a response of rollout.response_length tokens; small next to the
# 0/1 task score, so a correct answer always beats a wrong one.
BREVITY_COEF = 0.1


def check_rule_reward(cfg: RunConfig) -> None:
    """The penalty is scaled for rule-based scores in [0, 1]; a reward model's are unbounded."""
    if cfg.reward_model.path is not None:
        raise ConfigError(
            f"algorithm.name=grpo_brevity scales its length penalty ({BREVITY_COEF} at most) to rule-based scores "
            f"in [0, 1], but reward_model.path={cfg.reward_model.path!r} gives unbounded model scores; remove "
            "reward_model.path, or use algorithm.name=grpo"
        )


@P.phase("brevity")
def brevity_penalty(step: P.Step, max_length: int) -> None:
    """token_level_scores minus BREVITY_COEF x length / max_length on each last response token."""
    b = step.batch.batch
    lengths = b["response_mask"].sum(-1).float()
    penalty = -BREVITY_COEF * lengths / max_length
    step.metrics["brevity/task_score_mean"] = float(b["token_level_scores"].sum(-1).double().mean())
    b["token_level_scores"] = b["token_level_scores"] + scores_at_last_response_token(penalty, b["response_mask"])
    step.metrics["brevity/penalty_mean"] = float(penalty.double().mean())


@register_algorithm(AlgorithmSpec(
    name="grpo_brevity",
    estimators=("grpo", "rloo"),  # group baselines; grpo when algorithm.adv_estimator is null
    min_samples=2,  # a group baseline compares the samples of one prompt
    presets=(("actor.loss.policy.loss_agg_mode", "token-mean"),),  # unless the config sets it
    check=check_rule_reward,
))
def grpo_brevity(step: P.Step, roles: P.Roles, cfg: RunConfig, state: AlgoState) -> None:
    """generate -> score -> brevity penalty -> log-probs -> advantages -> actor update."""
    generate_and_score(step, roles, cfg)
    brevity_penalty(step, cfg.rollout.response_length)
    train_critic_free(step, roles, cfg, state)
