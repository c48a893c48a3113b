"""The asynchronous modes' data path: rollout -> reward -> training, without the controller.

In trainer.mode one_step_off / async the trained batch never reaches the controller. What
travels, and where it is computed:

1. The rollout pool generates, scores each finished prompt group with the run's
   rule-based reward (workers/rollout.py: the scorers and reward templates, right after
   generation) and puts every group into Ray's object store. The controller receives object
   refs and a steering record per group: uid, policy version of its oldest token, and
   whether its scores differ (DAPO). It admits, buffers and drops groups by these.
2. For a step the controller hands the refs of the chosen groups to `_assemble`, a Ray
   task with no CPU reserved (it runs in a Ray worker process, beside the pools): it
   concatenates the groups, orders the samples for balanced data-parallel ranks
   (trainer.balance_batch) and measures the staleness of the trained tokens.
3. The training pool's calls take futures: the actor's old and reference log-probs, the
   critic's values and the reward model's scores read their inputs from the object store
   (`WorkerGroup.submit` with `value_future`s, resolved by Ray inside the workers).
4. `_finish`, another such task, joins those outputs with the batch and runs what the
   synchronous program runs on the controller: reward-model scores, DAPO's overlong
   shaping, the KL penalty in the reward, the advantage estimator (the same phase
   functions, trainer/phases.py), the batch's data metrics and sequence lengths
   (`BatchSummary`), and cuts the update inputs.
5. The critic and actor updates read those inputs from the object store; their results
   carry only metrics.

The controller fetches the steering records, the metrics (with the KL the adaptive KL
controller follows) and the sequence lengths: no tensor of the batch
(`hybridflow.controller.futures.LEDGER` counts what it fetches; each step logs
`controller/fetched_tensor_bytes`, and tests/trainer/test_async_dataflow.py asserts 0).
The same numbers come out as the synchronous program computes: max_staleness=0 still
reproduces sync mode's metrics exactly (tests/trainer/test_async_modes.py).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

import ray

from hybridflow.algorithms import AdvantageConfig
from hybridflow.algorithms.off_policy import staleness_metrics
from hybridflow.config.algorithm_settings import overlong_buffer_len
from hybridflow.config.schema import RunConfig
from hybridflow.controller import CallFuture, WorkerGroup
from hybridflow.controller.futures import RankInfo, gather, value_future
from hybridflow.engines.rollout.partial import POLICY_VERSION
from hybridflow.engines.train.actor import FORWARD_KEYS as ACTOR_FORWARD_KEYS
from hybridflow.engines.train.batching import dp_balanced_order
from hybridflow.engines.train.critic import FORWARD_KEYS as CRITIC_FORWARD_KEYS
from hybridflow.engines.train.critic import UPDATE_KEYS as CRITIC_UPDATE_KEYS
from hybridflow.protocol import DataProto
from hybridflow.rewards.manager import outcome_metrics
from hybridflow.trainer import phases as P
from hybridflow.trainer.algorithms import AlgoState, reward_model_weight, rule_reward_manager
from hybridflow.trainer.metrics import BatchSummary, rename_worker_metrics
from hybridflow.trainer.phases import Roles, Step
from hybridflow.workers.reward_model import SCORE_KEYS
from hybridflow.workers.rollout import COST_COLUMNS

# Who the tasks' failures are reported as (they belong to no worker group).
DATAFLOW = RankInfo("dataflow", 0, "", None)


@dataclass(frozen=True)
class Recipe:
    """What the worker-side tasks compute after the log-probs and values: the algorithm's
    post-scoring math, as plain settings (it travels with the task)."""

    estimator: str
    advantage: AdvantageConfig
    kl_ctrl: Any  # a copy of the run's KL controller (its value is the beta used), or None
    kl_type: str
    rule_reward: bool  # the groups carry token_level_scores from the rollout pool
    model_weight: float  # of the reward model's scores, when the run has one
    overlong: tuple[int, int, float] | None  # DAPO: (max response length, buffer, penalty factor)
    with_ref: bool
    with_behaviour: bool
    critic: bool
    # Safe-RLHF: a copy of the Lagrange multiplier (updated by the batch's cost, its state
    # sent back), and whether the groups carry token_level_costs from the rollout pool.
    lagrange: Any = None
    rule_cost: bool = False
    # ReMax: the groups carry baseline_rewards (their greedy response's score, rollout pool)
    greedy_baseline: bool = False

    @classmethod
    def of(cls, cfg: RunConfig, roles: Roles, state: AlgoState) -> Recipe:
        alg = cfg.algorithm
        dapo = alg.spec.settings == "dapo" and alg.dapo.overlong_buffer.enable
        return cls(
            estimator="gae" if roles.critic is not None else alg.estimator, advantage=alg.advantage_config(),
            kl_ctrl=copy.deepcopy(state.kl_ctrl) if alg.use_kl_in_reward else None, kl_type=alg.kl_penalty,
            rule_reward=rule_reward_manager(roles, cfg) is not None, model_weight=reward_model_weight(cfg),
            overlong=(cfg.rollout.response_length, overlong_buffer_len(cfg), alg.dapo.overlong_buffer.penalty_factor)
            if dapo else None,
            with_ref=cfg.actor.loss.use_kl_loss, with_behaviour=cfg.actor.loss.off_policy.enabled,
            critic=roles.critic is not None, lagrange=copy.deepcopy(state.lagrange), rule_cost=roles.cost_fn is not None,
            greedy_baseline=alg.spec.program.endswith(":remax"),
        )


def train_on_groups(step: Step, roles: Roles, cfg: RunConfig, state: AlgoState, groups: list[ray.ObjectRef],
                    version: int, restarts: dict[str, float]) -> None:
    """Train one step on the prompt groups behind `groups` (refs into the object store),
    trained at policy `version`; the batch stays in the workers (module docstring). Fills
    step.metrics and step.summary; `restarts`: the scoring pools' worker restarts reported
    by the rollout calls this step received ({reward,cost}/worker_restarts)."""
    start = time.perf_counter()
    dp = roles.actor.dp_parts("update_actor") if step.balance_dp else 1
    critics = roles.critic is not None or roles.cost_critic is not None
    scorers = roles.reward_model is not None or roles.cost_model is not None
    batch, actor_in, critic_in, score_in, staleness = _assemble.options(num_returns=5).remote(
        version, dp, critics, scorers, *groups)
    forward = value_future(actor_in, "dataflow.assemble", DATAFLOW)
    old = roles.actor.submit("compute_log_prob", forward) if not cfg.fuses_old_log_probs else None
    ref = roles.actor.submit("compute_ref_log_prob", forward) if cfg.use_reference else None
    values = _submit(roles.critic, "compute_values", critic_in)
    cost_values = _submit(roles.cost_critic, "compute_values", critic_in)
    scores = _submit(roles.reward_model, "compute_rm_score", score_in)
    costs = _submit(roles.cost_model, "compute_rm_score", score_in)
    recipe = Recipe.of(cfg, roles, state)
    actor_update, critic_update, cost_critic_update, report = _finish.options(num_returns=4).remote(
        recipe, restarts, batch, *(_whole(f) for f in (old, ref, values, scores, cost_values, costs)))
    critic_out = _submit(roles.critic, "update_critic", critic_update)
    cost_critic_out = _submit(roles.cost_critic, "update_critic", cost_critic_update)
    actor_out = roles.actor.submit("update_actor", value_future(actor_update, "dataflow.finish", DATAFLOW))
    metrics, summary = gather([staleness, report], [DATAFLOW, DATAFLOW], "dataflow")
    step.metrics.update(metrics)
    step.metrics.update(summary.pop("step_metrics"))
    if critic_out is not None:
        step.metrics.update(rename_worker_metrics(_metrics_only(critic_out), "critic"))
    if cost_critic_out is not None:
        step.metrics.update(P.cost_critic_metrics(_metrics_only(cost_critic_out)))
    step.metrics.update(rename_worker_metrics(_metrics_only(actor_out), "actor"))
    # The controller's cross-step state follows the batch, as in sync mode: the KL controller
    # by the batch's KL, Safe-RLHF's multiplier as the task updated its copy.
    if state.kl_ctrl is not None:
        state.kl_ctrl.update(step.metrics["kl/penalty"], n_steps=summary["samples"])
    if state.lagrange is not None:
        state.lagrange.load_state_dict(summary["lagrange"])
    step.summary = BatchSummary(summary["data"], summary["seq_lens"])
    step.metrics["timing_s/train"] = time.perf_counter() - start


def _submit(group: WorkerGroup | None, method: str, data: ray.ObjectRef) -> CallFuture | None:
    """`group.<method>` on the data behind `data` without waiting; None where the run has no such role."""
    return group.submit(method, value_future(data, f"dataflow -> {method}", DATAFLOW)) if group is not None else None


def _whole(future: CallFuture | None) -> ray.ObjectRef | None:
    return future.whole_ref() if future is not None else None


def _metrics_only(future: CallFuture) -> dict[str, float]:
    out = future.get()
    if out.batch or out.non_tensor_batch:
        raise RuntimeError(f"{future.method} returned per-sample data; the asynchronous data path expects metrics only")
    return dict(out.meta_info.get("metrics", {}))


# ----------------------------------------------------------------------------- worker-side tasks


@ray.remote(num_cpus=0)
def _assemble(version: int, dp: int, critic: bool, reward_model: bool, *groups: DataProto
              ) -> tuple[DataProto, DataProto, DataProto | None, DataProto | None, dict[str, float]]:
    """The step's batch from its groups (in order), balanced for `dp` ranks; the inputs of
    the actor's forward passes, of the critic's and of the reward model's (None for a role
    the run does not have); staleness metrics of the trained tokens at `version`."""
    batch = P.concat_generated(list(groups))
    if dp > 1 and len(batch) % dp == 0:
        # The order every dp-split call of the step sees (the sync program's dp_call computes
        # the same permutation per call and puts the outputs back).
        batch.reorder(dp_balanced_order(batch.batch["attention_mask"], dp))
    metrics = staleness_metrics(batch.batch[POLICY_VERSION], batch.batch["response_mask"], version)
    return (batch, P._select(batch, ACTOR_FORWARD_KEYS), P._select(batch, CRITIC_FORWARD_KEYS) if critic else None,
            P._select(batch, SCORE_KEYS) if reward_model else None, metrics)


@ray.remote(num_cpus=0)
def _finish(recipe: Recipe, restarts: dict[str, float], batch: DataProto, old: DataProto | None,
            ref: DataProto | None, values: DataProto | None, scores: DataProto | None, cost_values: DataProto | None,
            costs: DataProto | None) -> tuple[DataProto, DataProto | None, DataProto | None, dict[str, Any]]:
    """Rewards (and Safe-RLHF's costs), advantages and metrics of the step's batch (module
    docstring, point 4); the actor's, critic's and cost critic's update inputs and the small
    report the controller fetches."""
    step = Step(0, batch)
    for out in (old, ref, values, scores, cost_values, costs):
        if out is not None:
            out.meta_info.pop("metrics", None)
    for out in (old, ref, values):
        if out is not None:
            batch.union(out)
    if recipe.rule_reward:
        # (a step that received no generation call this time has no restarts to report)
        step.metrics.update(outcome_metrics(batch, restarts.get("reward/worker_restarts", 0.0)))
    if scores is not None:
        batch.batch["token_level_scores"] = P.add_model_scores(
            batch.batch["token_level_scores"] if recipe.rule_reward else None, batch,
            scores.batch["rm_scores"], recipe.model_weight, step.metrics)
    if recipe.lagrange is not None:
        _costs(step, recipe, restarts, costs)
    if cost_values is not None:
        batch.batch["cost_values"] = cost_values.batch["values"]
    if recipe.overlong is not None:
        P.add_overlong_penalty(step, *recipe.overlong)
    if recipe.kl_ctrl is not None:
        P.rewards_with_kl_penalty(step, recipe.kl_ctrl, recipe.kl_type)  # updates the copy; the controller its own
    else:
        P.rewards_are_scores(step)
    if recipe.greedy_baseline:
        step.metrics["remax/baseline_mean"] = float(batch.batch["baseline_rewards"].double().mean())
    P.compute_advantages(step, recipe.estimator, recipe.advantage,
                         ("baseline_rewards",) if recipe.greedy_baseline else ())
    if recipe.lagrange is not None:
        P.compute_safe_advantages(step, recipe.lagrange, recipe.advantage)
    P.record_signal(step)  # adv/silent_groups: the controller says when no group has signal (trainer/signal.py)
    actor_in = P._select(batch, P.actor_update_keys(batch, recipe.with_ref, recipe.with_behaviour))
    critic_in = P._select(batch, CRITIC_UPDATE_KEYS) if recipe.critic else None
    cost_critic_in = P.cost_critic_input(batch) if recipe.lagrange is not None else None
    summary = BatchSummary.of(batch)
    report = {"step_metrics": step.metrics, "data": summary.metrics, "seq_lens": summary.seq_lens,
              "samples": len(batch),
              "lagrange": recipe.lagrange.state_dict() if recipe.lagrange is not None else None}
    return actor_in, critic_in, cost_critic_in, report


def _costs(step: Step, recipe: Recipe, restarts: dict[str, float], costs: DataProto | None) -> None:
    """Safe-RLHF's token_level_costs: the rollout pool's rule-based costs plus the cost
    model's scores, with the metrics sync mode's cost phase reports."""
    batch, metrics = step.batch, {}
    total = None
    if recipe.rule_cost:
        total = batch.batch["token_level_costs"]
        metrics.update(outcome_metrics(batch, restarts.get("cost/worker_restarts", 0.0), prefix=COST_COLUMNS))
    if costs is not None:
        total = P.add_model_scores(total, batch, costs.batch["rm_scores"], 1.0, metrics)
    P.set_costs(step, total, metrics)
