"""The phases of an RL step, each one named function on worker-group calls.

A phase reads what earlier phases put into `step.batch` (names from ARCHITECTURE.md),
adds its own keys, and records its metrics and wall time (`timing_s/<phase>`) in
`step.metrics`. Algorithms (algorithms.py) are short sequences of these calls.

Weight sync has no phase of its own: the actor's updated weights reach the generation
engine inside the next `generate_sequences` call (3D-HybridEngine reshard), timed by the
worker as `timing_s/reshard_to_generation`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from hybridflow.algorithms import AdvantageConfig, apply_kl_in_reward, compute_advantage
from hybridflow.controller import WorkerGroup
from hybridflow.engines.train.actor import FORWARD_KEYS as ACTOR_FORWARD_KEYS
from hybridflow.engines.train.actor import UPDATE_KEYS as ACTOR_UPDATE_KEYS
from hybridflow.engines.train.critic import FORWARD_KEYS as CRITIC_FORWARD_KEYS
from hybridflow.engines.train.critic import UPDATE_KEYS as CRITIC_UPDATE_KEYS
from hybridflow.protocol import DataProto
from hybridflow.trainer.metrics import rename_worker_metrics

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Roles:
    """What the step program talks to."""

    actor: WorkerGroup  # ActorRolloutRefWorker: generation, log-probs, reference policy, update
    critic: WorkerGroup | None  # CriticWorker (algorithm.name=ppo)
    reward: Any  # hybridflow.rewards.RewardManager: scores responses in worker processes


@dataclass
class Step:
    """One RL step in flight: the batch (prompts at first) and what the phases measured."""

    index: int
    batch: DataProto
    metrics: dict[str, float] = field(default_factory=dict)
    # The next batch of prompts from the run's loader, for programs that generate more
    # than one batch per step (DAPO's dynamic sampling); None where there is no loader.
    more_prompts: Callable[[], DataProto] | None = None


def phase(name: str) -> Callable[[F], F]:
    """Time the decorated phase into step.metrics["timing_s/<name>"]."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def timed(step: Step, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(step, *args, **kwargs)
            finally:
                step.metrics[f"timing_s/{name}"] = time.perf_counter() - start

        return timed  # type: ignore[return-value]

    return wrap


def _worker_metrics(out: DataProto) -> dict[str, float]:
    return dict(out.meta_info.pop("metrics", {}))


def _select(batch: DataProto, keys: tuple[str, ...]) -> DataProto:
    # Only what the worker reads travels; meta_info (temperature) goes along.
    return batch.select(batch_keys=keys, non_tensor_keys=[])


@phase("gen")
def generate(step: Step, actor: WorkerGroup, n: int) -> None:
    """n samples per prompt; `uid` marks the samples of one prompt (the GRPO group)."""
    prompts = step.batch
    prompts.non_tensor_batch["uid"] = np.array([f"{step.index}-{i}" for i in range(len(prompts))], dtype=object)
    out = actor.generate_sequences(prompts)
    step.metrics.update(_worker_metrics(out))
    if len(out) != len(prompts) * n:
        raise RuntimeError(f"generate_sequences returned {len(out)} samples for {len(prompts)} prompts x n={n}")
    step.batch = out


@phase("reward")
def compute_reward(step: Step, reward_manager: Any) -> None:
    """token_level_scores from the reward function (failures and timeouts score error_score)."""
    out = reward_manager.score(step.batch)
    step.batch.batch["token_level_scores"] = out.token_level_scores
    metrics = dict(out.metrics)
    metrics.pop("reward/mean")  # the same number as score/mean (metrics.py)
    step.metrics.update(metrics)


@phase("old_log_prob")
def compute_old_log_probs(step: Step, actor: WorkerGroup) -> None:
    """old_log_probs (and entropys) of the responses under the policy that sampled them."""
    step.batch.union(actor.compute_log_prob(_select(step.batch, ACTOR_FORWARD_KEYS)))


@phase("ref")
def compute_ref_log_probs(step: Step, actor: WorkerGroup) -> None:
    """ref_log_probs under the frozen reference policy (KL loss or KL in reward)."""
    step.batch.union(actor.compute_ref_log_prob(_select(step.batch, ACTOR_FORWARD_KEYS)))


@phase("values")
def compute_values(step: Step, critic: WorkerGroup) -> None:
    """values [B, R]: the critic's estimate before each response token."""
    step.batch.union(critic.compute_values(_select(step.batch, CRITIC_FORWARD_KEYS)))


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
def compute_advantages(step: Step, estimator: str, config: AdvantageConfig) -> None:
    """advantages and returns with the named estimator (docs/algorithms.md)."""
    b = step.batch.batch
    advantages, returns = compute_advantage(
        estimator, b["token_level_rewards"], b["response_mask"], config=config,
        values=b.get("values"), uid=step.batch.non_tensor_batch["uid"],
    )
    b["advantages"], b["returns"] = advantages, returns


@phase("update_critic")
def update_critic(step: Step, critic: WorkerGroup) -> None:
    """One value-function update on the step's batch."""
    out = critic.update_critic(_select(step.batch, CRITIC_UPDATE_KEYS))
    step.metrics.update(rename_worker_metrics(_worker_metrics(out), "critic"))


@phase("update_actor")
def update_actor(step: Step, actor: WorkerGroup, with_ref: bool) -> None:
    """One policy update on the step's batch (plus the KL loss when configured)."""
    keys = ACTOR_UPDATE_KEYS + (("ref_log_probs",) if with_ref else ())
    out = actor.update_actor(_select(step.batch, keys))
    step.metrics.update(rename_worker_metrics(_worker_metrics(out), "actor"))
