"""The phases of an RL step, each one named function on worker-group calls.

A phase reads what earlier phases put into `step.batch` (names from ARCHITECTURE.md),
adds its own keys, and records its metrics and wall time (`timing_s/<phase>`) in
`step.metrics`. Algorithms (programs/algorithms.py) are short sequences of these calls.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch

from hybridflow.algorithms import (
    AdvantageConfig,
    LagrangeMultiplier,
    apply_kl_in_reward,
    combine_reward_cost_advantages,
    compute_advantage,
    compute_cost_advantages,
    dynamic_sampling_filter,
    overlong_reward_penalty,
    silent_groups,
)
from hybridflow.controller import WorkerGroup
from hybridflow.engines.rollout.batch_io import left_pad_prompts
from hybridflow.engines.train.batching import dp_balanced_order
from hybridflow.engines.train.actor import FORWARD_KEYS as ACTOR_FORWARD_KEYS
from hybridflow.engines.train.actor import OLD_LOG_PROBS
from hybridflow.engines.train.actor import UPDATE_KEYS as ACTOR_UPDATE_KEYS
from hybridflow.engines.train.critic import FORWARD_KEYS as CRITIC_FORWARD_KEYS
from hybridflow.engines.train.critic import UPDATE_KEYS as CRITIC_UPDATE_KEYS
from hybridflow.protocol import DataProto
from hybridflow.trainer.observe.metrics import BatchSummary, rename_worker_metrics
# concurrently is re-exported: programs call P.concurrently
from hybridflow.trainer.programs.concurrent import Block, ConcurrencyError, concurrently  # noqa: F401
from hybridflow.workers.reward_model import SCORE_KEYS, scores_at_last_response_token

F = TypeVar("F", bound=Callable[..., Any])

SILENT_GROUPS, GROUPS = "adv/silent_groups", "adv/groups"  # record_signal


@dataclass
class Roles:
    """What the step program talks to (the roles of its task kind; the others are None)."""

    actor: WorkerGroup | None = None  # ActorRolloutRefWorker: generation, log-probs, reference policy, update
    critic: WorkerGroup | None = None  # CriticWorker (algorithms with a critic: ppo, safe_rlhf)
    reward: Any = None  # hybridflow.rewards.RewardManager: scores responses in worker processes
    reward_model: WorkerGroup | None = None  # RewardModelWorker (reward_model.path)
    cost_critic: WorkerGroup | None = None  # CriticWorker of the costs (safe_rlhf)
    cost_model: WorkerGroup | None = None  # RewardModelWorker scoring costs (cost_model.path)
    cost_fn: Any = None  # RewardManager of the rule-based cost function (cost_model.custom_fn_path)
    runners: WorkerGroup | None = None  # EnvRunnerWorker: environments and the acting policy (environment tasks)
    learner: WorkerGroup | None = None  # LearnerWorker: the policy's updates (environment tasks)


@dataclass
class Step:
    """One RL step in flight: the batch (prompts at first) and what the phases measured."""

    index: int
    batch: DataProto
    metrics: dict[str, float] = field(default_factory=dict)
    # The next batch of prompts from the run's loader, for programs that generate more
    # than one batch per step (DAPO's dynamic sampling); None where there is no loader.
    more_prompts: Callable[[], DataProto] | None = None
    # trainer.balance_batch: reorder dp-split calls for equal tokens per rank (dp_call).
    balance_dp: bool = True
    # Told each phase's name as it starts (the trainer's live status: observe/live_status.py).
    on_phase: Callable[[str], None] | None = None
    # Set where the batch stayed in the workers (the asynchronous modes): its metrics and
    # sequence lengths; `batch` is then empty.
    summary: BatchSummary | None = None
    # The asynchronous modes (trainer/modes/stream_step.py): the batch their rollout pool generated
    # and scored for this step, which the generate phase takes instead of calling the actor,
    # and the capabilities of the algorithm's row (AlgorithmSpec.capabilities) the pool served
    # with it, whose phases then only report what it did.
    streamed: DataProto | None = None
    served: frozenset[str] = frozenset()
    streamed_greedy: DataProto | None = None  # greedy_baseline: one greedy response per group
    # trainer.concurrent_phases: the calls of a `concurrently` block are in flight together
    # (False: each is waited for when submitted; the results are the same).
    concurrent: bool = True
    # The `concurrently` block running now (None outside one): dp_call and `phase` defer to it.
    block: Block | None = field(default=None, repr=False)


def phase(name: str) -> Callable[[F], F]:
    """Time the decorated phase into step.metrics["timing_s/<name>"] (summed over the calls
    of one step: DAPO generates several times)."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def timed(step: Step, *args: Any, **kwargs: Any) -> Any:
            if step.on_phase is not None:
                step.on_phase(name)
            if step.block is not None and step.block.current is None:  # timed by the block (concurrent.py)
                return step.block.run_phase(name, lambda: fn(step, *args, **kwargs))
            start = time.perf_counter()
            try:
                return fn(step, *args, **kwargs)
            finally:
                key = f"timing_s/{name}"
                step.metrics[key] = step.metrics.get(key, 0.0) + time.perf_counter() - start

        timed.phase_name = name  # type: ignore[attr-defined]  # the planner's dataflow test reads it
        return timed  # type: ignore[return-value]

    return wrap


def _worker_metrics(out: DataProto) -> dict[str, float]:
    return dict(out.meta_info.pop("metrics", {}))


def _select(batch: DataProto, keys: tuple[str, ...]) -> DataProto:
    # Only what the worker reads travels; meta_info (temperature) goes along.
    return batch.select(batch_keys=keys, non_tensor_keys=[])


def dp_call(step: Step, group: WorkerGroup, method: str, data: DataProto,
            then: Callable[[DataProto], None] | None = None) -> DataProto | None:
    """``group.<method>(data)`` for a method that cuts `data` into contiguous dp-rank parts;
    `then(result)` handles the result (the phase's writes into step.batch and step.metrics).

    With `step.balance_dp` the rows of `data` (a selected copy: reordered in place) are
    first permuted by `dp_balanced_order`, so every dp rank gets a near-equal number of
    valid tokens and no rank waits for the one that drew the long sequences; per-sample
    outputs are put back in the original order. The permutation keeps each optimizer
    step's (mini-batch's) sample set, so results do not change beyond float summation order.
    A batch that the ranks do not divide is sent as it is (dispatch pads it).

    Outside a `concurrently` block the call is waited for, `then` runs, and the result is
    returned. Inside one it is submitted without waiting, `then` is required and runs at the
    block's end, and nothing is returned.
    """
    dp = group.dp_parts(method) if step.balance_dp else 1
    order = None
    if dp > 1 and len(data) % dp == 0:
        order = dp_balanced_order(data.batch["attention_mask"], dp)
        data.reorder(order)

    def in_batch_order(out: DataProto) -> DataProto:
        if order is not None and (out.batch or out.non_tensor_batch):  # updates return only metrics
            out.reorder(torch.argsort(order))  # the inverse permutation
        return out

    if step.block is not None:
        if then is None:
            raise ConcurrencyError(f"dp_call({group!r}, {method!r}) inside a concurrently block needs then=: the "
                                   "result arrives at the block's end, where then(result) handles it")
        step.block.submit(group, method, data, lambda out: then(in_batch_order(out)))
        return None
    out = in_batch_order(getattr(group, method)(data))
    if then is not None:
        then(out)
    return out


@phase("gen")
def generate(step: Step, actor: WorkerGroup, n: int, round: int = 0) -> None:
    """n samples per prompt; `uid` marks the samples of one prompt (the GRPO group), unique
    within the step across generation rounds. In the asynchronous modes the rollout pool's
    stream serves it: the step's batch is the groups it generated (`Step.streamed`)."""
    if step.served:  # once: the stream serves one generation per step (more rounds: dynamic_sampling)
        if step.streamed is None:
            raise RuntimeError("the step program generated twice in one step; trainer.mode one_step_off / async "
                               "serve one generation per step from the rollout pool (declare dynamic_sampling on "
                               "the algorithm's AlgorithmSpec for more rounds of informative groups), or use "
                               "trainer.mode=sync")
        step.batch, step.streamed = step.streamed, None
        return
    prompts = step.batch
    prefix = f"{step.index}-" if round == 0 else f"{step.index}.{round}-"
    prompts.non_tensor_batch["uid"] = np.array([f"{prefix}{i}" for i in range(len(prompts))], dtype=object)
    out = actor.generate_sequences(prompts)
    step.metrics.update(_worker_metrics(out))
    if len(out) != len(prompts) * n:
        raise RuntimeError(f"generate_sequences returned {len(out)} samples for {len(prompts)} prompts x n={n}")
    step.batch = out


def score_sequences(batch: DataProto, rule: Any | None, model: WorkerGroup | None,
                    model_weight: float = 1.0) -> tuple[torch.Tensor, dict]:
    """Token-level scores [B, R] of `batch` and their metrics: the rule-based function's
    (a RewardManager; failures and timeouts score error_score), the model's score x
    `model_weight` (the reward_model template's weight) put on the last response token, or
    the sum of both. A multi-turn row whose environment failed (score_override) gets no
    model score: its configured error_score stands."""
    if rule is None and model is None:
        raise ValueError("score_sequences needs a rule-based scorer, a scoring model, or both")
    scores, metrics = None, {}
    if rule is not None:
        out = rule.score(batch)
        scores, metrics = out.token_level_scores, dict(out.metrics)
        metrics.pop("reward/mean")  # the same number as score/mean (observe/metrics.py)
    if model is not None:
        rm = model.compute_rm_score(_select(batch, SCORE_KEYS)).batch["rm_scores"]
        weighted = model_weight * rm.to(torch.float32) * _env_kept(batch)
        placed = scores_at_last_response_token(weighted, batch.batch["response_mask"])
        metrics["reward/model_score_mean"] = float(rm.double().mean())
        metrics["template/reward_model"] = float(weighted.double().mean())
        scores = placed if scores is None else scores + placed
    return scores, metrics


def _env_kept(batch: DataProto) -> torch.Tensor:
    """[B] 0 for rows whose environment failed (a non-NaN score_override), else 1."""
    override = batch.non_tensor_batch.get("score_override")
    if override is None:
        return torch.ones(len(batch))
    return torch.tensor([float(math.isnan(float(v))) for v in override])


@phase("reward")
def compute_reward(step: Step, rule: Any | None, model: WorkerGroup | None = None, model_weight: float = 1.0) -> None:
    """token_level_scores from the reward function and/or the reward model (score_sequences)."""
    step.batch.batch["token_level_scores"], metrics = score_sequences(step.batch, rule, model, model_weight)
    step.metrics.update(metrics)


@phase("cost")
def compute_cost(step: Step, rule: Any | None, model: WorkerGroup | None) -> None:
    """token_level_costs (Safe-RLHF) from the cost function and/or the cost model; the
    scorers' metrics under cost/, and the episode costs' stats."""
    costs, metrics = score_sequences(step.batch, rule, model)
    step.batch.batch["token_level_costs"] = costs
    step.metrics.update({key.replace("reward/", "cost/", 1): value for key, value in metrics.items()})
    episode = costs.double().sum(-1)
    step.metrics.update({"cost/mean": float(episode.mean()), "cost/max": float(episode.max()),
                         "cost/min": float(episode.min())})


@phase("greedy_baseline")
def compute_greedy_baseline(step: Step, prompts: DataProto, actor: WorkerGroup,
                            score: Callable[[DataProto], torch.Tensor]) -> None:
    """ReMax: baseline_rewards [B], the score of one greedy response to each sample's prompt.

    `prompts` carry the `uid` that `generate` gave them; `score` returns token-level scores.
    In the asynchronous modes (the greedy_baseline capability served by the rollout pool)
    the greedy responses arrive with the groups (`Step.streamed_greedy`), scored there.
    """
    if "greedy_baseline" in step.served:  # generated with the groups on the rollout pool
        out = step.streamed_greedy
    else:
        greedy = DataProto(batch=prompts.batch, non_tensor_batch=prompts.non_tensor_batch,
                           meta_info={**prompts.meta_info, "do_sample": False, "n": 1})
        out = actor.generate_sequences(greedy)
        out.meta_info.pop("metrics", None)
    by_uid = dict(zip(out.non_tensor_batch["uid"], score(out).sum(-1).tolist()))
    baseline = torch.tensor([by_uid[u] for u in step.batch.non_tensor_batch["uid"]], dtype=torch.float32)
    step.batch.batch["baseline_rewards"] = baseline
    step.metrics["remax/baseline_mean"] = float(baseline.double().mean())


@phase("old_log_prob")
def compute_old_log_probs(step: Step, actor: WorkerGroup) -> None:
    """old_log_probs (and entropys) of the responses under the policy that sampled them."""
    dp_call(step, actor, "compute_log_prob", _select(step.batch, ACTOR_FORWARD_KEYS), then=step.batch.union)


@phase("ref")
def compute_ref_log_probs(step: Step, actor: WorkerGroup) -> None:
    """ref_log_probs under the frozen reference policy (KL loss or KL in reward)."""
    dp_call(step, actor, "compute_ref_log_prob", _select(step.batch, ACTOR_FORWARD_KEYS), then=step.batch.union)


@phase("values")
def compute_values(step: Step, critic: WorkerGroup) -> None:
    """values [B, R]: the critic's estimate before each response token."""
    dp_call(step, critic, "compute_values", _select(step.batch, CRITIC_FORWARD_KEYS), then=step.batch.union)


@phase("cost_values")
def compute_cost_values(step: Step, cost_critic: WorkerGroup) -> None:
    """cost_values [B, R]: the cost critic's estimate (Safe-RLHF)."""
    def add(out: DataProto) -> None:
        step.batch.batch["cost_values"] = out.batch["values"]

    dp_call(step, cost_critic, "compute_values", _select(step.batch, CRITIC_FORWARD_KEYS), then=add)


@phase("kl_reward")
def rewards_with_kl_penalty(step: Step, kl_ctrl: Any, kl_type: str) -> None:
    """token_level_rewards = scores - beta * KL(actor || reference) per token."""
    b = step.batch.batch
    rewards, metrics = apply_kl_in_reward(b["token_level_scores"], b["old_log_probs"], b["ref_log_probs"],
                                          b["response_mask"], kl_ctrl, kl_type)
    b["token_level_rewards"] = rewards
    step.metrics.update({"kl/penalty": metrics["kl_penalty"], "kl/coef": metrics["kl_coef"]})


def rewards_are_scores(step: Step) -> None:
    """token_level_rewards = token_level_scores (no KL in the reward)."""
    step.batch.batch["token_level_rewards"] = step.batch.batch["token_level_scores"]


@phase("adv")
def compute_advantages(step: Step, estimator: str, config: AdvantageConfig, extra_keys: tuple[str, ...] = ()) -> None:
    """advantages and returns with the named estimator (docs/algorithms.md); `extra_keys`
    are batch tensors passed to it by name (remax: baseline_rewards)."""
    b = step.batch.batch
    advantages, returns = compute_advantage(
        estimator, b["token_level_rewards"], b["response_mask"], config=config,
        values=b.get("values"), uid=step.batch.non_tensor_batch["uid"], **{key: b[key] for key in extra_keys},
    )
    b["advantages"], b["returns"] = advantages, returns


@phase("cost_adv")
def compute_safe_advantages(step: Step, multiplier: LagrangeMultiplier, config: AdvantageConfig) -> None:
    """Safe-RLHF: cost advantages (GAE with the cost critic), the multiplier's update from the
    batch's mean episode cost, then advantages = (A_reward - lambda A_cost) / (1 + lambda)."""
    b = step.batch.batch
    b["cost_advantages"], b["cost_returns"] = compute_cost_advantages(
        b["token_level_costs"], b["response_mask"], b["cost_values"], config)
    lam = multiplier.update(float(b["token_level_costs"].double().sum(-1).mean()))
    b["advantages"] = combine_reward_cost_advantages(b["advantages"], b["cost_advantages"], lam)
    step.metrics["safe_rlhf/lambda"] = lam


@phase("overlong")
def add_overlong_penalty(step: Step, max_response_length: int, buffer_len: int, penalty_factor: float) -> None:
    """DAPO soft overlong punishment, added to token_level_scores at the last response token."""
    b = step.batch.batch
    penalty = overlong_reward_penalty(b["response_mask"].sum(-1), max_response_length, buffer_len, penalty_factor)
    b["token_level_scores"] = b["token_level_scores"] + scores_at_last_response_token(penalty, b["response_mask"])
    overlong_metrics(step, max_response_length, buffer_len, penalty_factor)


def overlong_metrics(step: Step, max_response_length: int, buffer_len: int, penalty_factor: float) -> None:
    """dapo/overlong_penalty_mean and dapo/overlong_ratio of the step's batch (the penalty its
    response lengths get)."""
    penalty = overlong_reward_penalty(step.batch.batch["response_mask"].sum(-1), max_response_length, buffer_len,
                                      penalty_factor)
    step.metrics["dapo/overlong_penalty_mean"] = float(penalty.double().mean())
    step.metrics["dapo/overlong_ratio"] = float((penalty < 0).double().mean())


@phase("update_critic")
def update_critic(step: Step, critic: WorkerGroup) -> None:
    """One value-function update on the step's batch."""
    dp_call(step, critic, "update_critic", _select(step.batch, CRITIC_UPDATE_KEYS),
            then=lambda out: step.metrics.update(rename_worker_metrics(_worker_metrics(out), "critic")))


@phase("update_cost_critic")
def update_cost_critic(step: Step, cost_critic: WorkerGroup) -> None:
    """One update of the cost critic towards cost_returns (Safe-RLHF): it reads the critic's
    keys, with cost_values and cost_returns as its values and returns; its metrics go under
    cost_critic/ (the worker reports them as critic/)."""
    b = step.batch.batch
    data = _select(step.batch, tuple(k for k in CRITIC_UPDATE_KEYS if k not in ("values", "returns")))
    data.batch["values"], data.batch["returns"] = b["cost_values"], b["cost_returns"]

    def add_metrics(out: DataProto) -> None:
        # Named as the critic's first (perf/critic_update_*), then every critic -> cost_critic.
        metrics = rename_worker_metrics(_worker_metrics(out), "critic")
        step.metrics.update({key.replace("critic", "cost_critic", 1): value for key, value in metrics.items()})

    dp_call(step, cost_critic, "update_critic", data, then=add_metrics)


@phase("update_actor")
def update_actor(step: Step, actor: WorkerGroup, with_ref: bool, with_behaviour: bool = False,
                 with_old: bool = True) -> None:
    """One policy update on the step's batch (plus the KL loss when configured; with
    `with_behaviour`, rollout_log_probs for the off-policy correction, actor.loss.off_policy;
    `with_old` False: the update computes old_log_probs itself, RunConfig.fuses_old_log_probs).
    Records adv/silent_groups and adv/groups first (`record_signal`)."""
    record_signal(step)
    keys = (ACTOR_UPDATE_KEYS + (("ref_log_probs",) if with_ref else ())
            + (("rollout_log_probs",) if with_behaviour else ()) + ((OLD_LOG_PROBS,) if with_old else ()))
    dp_call(step, actor, "update_actor", _select(step.batch, keys),
            then=lambda out: step.metrics.update(rename_worker_metrics(_worker_metrics(out), "actor")))


def record_signal(step: Step) -> None:
    """adv/silent_groups of adv/groups: the groups whose advantages are all 0, which give the
    policy gradient nothing (algorithms.silent_groups); the trainer reports steps where all are."""
    b = step.batch
    if "uid" not in b.non_tensor_batch:  # a batch not drawn in groups (a caller's own): nothing to count
        return
    silent, groups = silent_groups(b.batch["advantages"], b.batch["response_mask"], b.non_tensor_batch["uid"])
    step.metrics[SILENT_GROUPS], step.metrics[GROUPS] = float(silent), float(groups)


# ----------------------------------------------------------------------------- DAPO dynamic sampling


@phase("dynamic_sampling")
def sample_informative_groups(step: Step, sample_round: Callable[[Step, int], None], groups: int,
                              max_extra_rounds: int, group_unit: int) -> None:
    """DAPO dynamic sampling: generate and score (`sample_round(step, round)`), drop the groups
    whose scores are all equal, and repeat with `step.more_prompts()` until `groups` groups
    are kept; the batch is then exactly the first `groups` kept groups.

    After `max_extra_rounds` extra rounds the step trains on the groups kept so far, cut to
    a multiple of `group_unit` (whole actor mini-batches), and reports dapo/cap_hit = 1;
    a RuntimeError if that leaves nothing. Metrics: dapo/rounds, dapo/generated_groups,
    dapo/kept_groups (informative groups found), dapo/trained_groups, dapo/cap_hit.

    In the asynchronous modes (the dynamic_sampling capability served by the rollout pool's
    stream) the groups were filtered as they arrived, with the same metrics but dapo/rounds:
    one round takes them.
    """
    if "dynamic_sampling" in step.served:
        sample_round(step, 0)
        return
    kept: list[DataProto] = []
    generated = found = rounds = 0
    prompts = step.batch
    while True:
        # Each round's phases are the step's: the live status hears them, concurrent_phases holds.
        part = Step(step.index, prompts, step.metrics, balance_dp=step.balance_dp, on_phase=step.on_phase,
                    concurrent=step.concurrent)
        sample_round(part, rounds)
        rounds += 1
        keep, counts = dynamic_sampling_filter(part.batch.non_tensor_batch["uid"],
                                               part.batch.batch["token_level_scores"].sum(-1))
        generated += int(counts["num_groups"])
        found += int(counts["kept_groups"])
        kept.append(part.batch[np.flatnonzero(keep)])
        if found >= groups or rounds > max_extra_rounds:
            break
        if step.more_prompts is None:
            raise RuntimeError("dynamic sampling needs more prompts but this step has no loader (Step.more_prompts)")
        prompts = step.more_prompts()
    target = groups_to_train(found, groups, group_unit,
                             f"kept {found} groups with differing rewards in {rounds} rounds ({generated} generated)")
    step.batch = first_groups(concat_generated(kept), target)  # target <= found: exactly `target` groups
    step.metrics.update({"dapo/rounds": float(rounds), "dapo/generated_groups": float(generated),
                         "dapo/kept_groups": float(found), "dapo/trained_groups": float(target),
                         "dapo/cap_hit": float(found < groups)})


# ----------------------------------------------------------------------------- exploration


@phase("explore")
def explore_silent_groups(step: Step, sample_round: Callable[[Step, int], None], max_extra_groups: int,
                          max_tries_per_prompt: int, unit: int) -> None:
    """Generate and score the step's prompts (`sample_round(step, round)`), then sample again
    the prompts whose group scored all alike (DAPO's filter finds them), each once a round,
    fewest tries first, in whole `unit`s (the rollout's data-parallel parts; fewer prompts
    than a unit are drawn twice), until each has a group that scored differently or the budget is
    spent: `max_extra_groups` more groups in the step, `max_tries_per_prompt` more of one
    prompt. Each prompt keeps its first group that differs, else its first group: the batch
    has one group per prompt, in prompt order, as without exploration.

    Metrics: explore/silent_before and explore/silent_after (groups of all-alike scores in
    the first round and in the batch trained on), explore/found (prompts that got a group
    that differs), explore/rounds, explore/extra_groups, explore/extra_samples and
    explore/extra_response_tokens (what the extra generation cost)."""
    prompts = step.batch
    chosen, differs = _sampled_groups(step, sample_round, prompts, np.arange(len(prompts)), 0)
    silent_before = int((~differs).sum())
    tries = np.zeros(len(prompts), dtype=np.int64)
    extra_groups = extra_samples = extra_tokens = rounds = 0
    while True:
        picks = _exploration_picks(differs, tries, max_tries_per_prompt, max_extra_groups - extra_groups, unit)
        if not len(picks):
            break
        rounds += 1
        got, got_differs = _sampled_groups(step, sample_round, prompts, picks, rounds)
        np.add.at(tries, picks, 1)
        extra_groups += len(picks)
        for k, i in enumerate(picks):
            extra_samples += len(got[k])
            extra_tokens += int(got[k].batch["response_mask"].sum())
            if got_differs[k] and not differs[i]:
                chosen[i], differs[i] = got[k], True
    step.batch = concat_generated(chosen)
    step.metrics.update({"explore/silent_before": float(silent_before), "explore/silent_after": float((~differs).sum()),
                         "explore/found": float(silent_before - (~differs).sum()), "explore/rounds": float(rounds),
                         "explore/extra_groups": float(extra_groups), "explore/extra_samples": float(extra_samples),
                         "explore/extra_response_tokens": float(extra_tokens)})


def _sampled_groups(step: Step, sample_round: Callable[[Step, int], None], prompts: DataProto, picks: np.ndarray,
                    round: int) -> tuple[list[DataProto], np.ndarray]:
    """One group per picked prompt (generated and scored in one round, as a part of `step`)
    and whether its scores differ."""
    part = Step(step.index, prompts[picks], step.metrics, balance_dp=step.balance_dp, on_phase=step.on_phase,
                concurrent=step.concurrent)
    sample_round(part, round)
    uids = part.batch.non_tensor_batch["uid"]
    keep, _ = dynamic_sampling_filter(uids, part.batch.batch["token_level_scores"].sum(-1))
    order = list(dict.fromkeys(uids.tolist()))  # one uid per picked prompt, groups in prompt order (generate)
    if len(order) != len(picks):
        raise RuntimeError(f"exploration round {round} generated {len(order)} groups for {len(picks)} prompts")
    rows = [np.flatnonzero(uids == uid) for uid in order]
    return [part.batch[r] for r in rows], np.array([bool(keep[r].any()) for r in rows])


def _exploration_picks(differs: np.ndarray, tries: np.ndarray, per_prompt: int, budget: int, unit: int) -> np.ndarray:
    """The prompts of the next exploration round: those without a group that differs and
    with tries left, each once, fewest tries first, cut to a whole number of `unit`s within
    `budget`; fewer such prompts than a unit are drawn again to fill one, within their own
    tries (empty: the exploration is over)."""
    left = np.where(differs, 0, per_prompt - tries)
    count = min(budget, int(left.sum()), max(int((left > 0).sum()), unit)) // unit * unit
    picks: list[int] = []
    taken = np.zeros_like(tries)
    while len(picks) < count:
        for i in sorted(np.flatnonzero(left - taken > 0), key=lambda i: (tries[i] + taken[i], i)):
            if len(picks) < count:
                picks.append(int(i))
                taken[i] += 1
    return np.array(picks, dtype=np.int64)


def groups_to_train(kept: int, wanted: int, unit: int, seen: str) -> int:
    """The groups a dynamic-sampling step trains on once it stops sampling (here, and in the
    asynchronous modes): `wanted` if it kept that many, else the `kept` ones cut to whole
    actor mini-batches (`unit` groups); a RuntimeError (`seen`: what the step got) if none."""
    if kept >= wanted:
        return wanted
    if kept < unit:
        raise RuntimeError(
            f"dynamic sampling {seen}, fewer than the {unit} one actor mini-batch needs: every other group scored "
            "all-equal. Raise algorithm.dapo.filter_groups.max_extra_rounds, check the reward function, or disable "
            "filter_groups")
    return kept - kept % unit


def concat_generated(parts: list[DataProto]) -> DataProto:
    """Generated batches of several rounds as one: prompts left-padded to the widest round's."""
    width = max(part.batch["prompts"].shape[1] for part in parts)
    return DataProto.concat([left_pad_prompts(part, width) for part in parts])


def first_groups(batch: DataProto, count: int) -> DataProto:
    """The samples of the first `count` groups (by first appearance of their uid)."""
    uids = batch.non_tensor_batch["uid"]
    chosen = set(list(dict.fromkeys(uids.tolist()))[:count])
    return batch[np.flatnonzero([u in chosen for u in uids])]
