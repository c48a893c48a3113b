"""PPO and SAC on environments: the programs on their registry rows, one iteration each as a
sequence of named phases.

    metrics = ppo_iteration(run)     # collect -> advantages -> update -> sync weights
    metrics = sac_iteration(run)     # collect -> store + update (one learner call) -> sync weights

An `EnvProgram` is what an environment algorithm's row (config/env_algorithms.py) names:
how it asks the runners for data (`submit`), one iteration, the network the runners act
with and how each learner rank builds its learner from the algorithm's config section.
The math is shared with language-model RL where it is the same (the value loss,
algorithms/value.py); GAE differs (episodes end inside a row: algorithms/env_advantages.py).

`run.groups.runners` are the env-runner workers, `run.groups.learner` the learner ranks
(groups.py: Ray worker groups, or in-process ones); the controller only moves
DataProtos (and the learner's new weights) between them and computes GAE. `run.sampler` decides when collections happen:

- sync: each iteration collects with the newest weights, then updates;
- async: `max_policy_lag` collections stay in flight, so the runners step with the weights
  they have while the learner updates. New weights go with the next collection submitted
  (`learn`), so the data of an update is at most max_policy_lag policy
  versions old; policy/lag_mean and policy/lag_max record it.

Phase timings are timing_s/<phase>; the rest of the metric names are in records.py.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hybridflow.algorithms.env_advantages import compute_env_gae
from hybridflow.algorithms.ppo_env import PPOLossConfig
from hybridflow.config.env_algorithms import steps_per_iteration
from hybridflow.config.env_schema import EnvRunConfig, PPOSection, SACSection
from hybridflow.engines.policy.actor_critic import ActorCritic
from hybridflow.engines.policy.ppo_learner import PPOUpdateConfig, build_ppo_learner
from hybridflow.engines.policy.sac_learner import TRANSITION_KEYS, SACUpdateConfig, build_sac_learner
from hybridflow.engines.policy.sac_model import SACModel
from hybridflow.protocol import DataProto
from hybridflow.trainer.env.groups import EnvGroups


class Sampler:
    """Collections in flight (futures, or batches restored from a checkpoint), oldest first."""

    def __init__(self, submit: Callable[[], Any], depth: int) -> None:
        self.submit = submit
        self.depth = depth  # 0: sync; k: up to k collections run while the learner updates
        self.pending: deque[Any] = deque()

    def next(self) -> DataProto:
        while len(self.pending) <= self.depth:
            self.pending.append(self.submit())
        item = self.pending.popleft()
        return item if isinstance(item, DataProto) else item.get()

    def drain(self) -> list[DataProto]:
        """Wait for every collection in flight and keep the batches (a checkpoint saves them)."""
        self.pending = deque(item if isinstance(item, DataProto) else item.get() for item in self.pending)
        return list(self.pending)


@dataclass
class EnvRun:
    """What the programs work on: config, groups, sampler and the counters they advance."""

    cfg: EnvRunConfig
    groups: EnvGroups
    sampler: Sampler | None = None
    horizon: int = 0  # environment steps a linear lr schedule decays over
    version: int = 0  # learner updates done = the policy version the runners catch up to
    env_steps: int = 0  # environment steps of the batches consumed so far
    submitted_steps: int = 0  # environment steps asked of the runners (consumed + in flight)
    weights: tuple[Any, int] | None = None  # (future of the learner's weights, version) not yet sent

    def start_sampler(self, submit: Callable[[], Any]) -> None:
        depth = self.cfg.distributed.max_policy_lag if self.cfg.distributed.sampling == "async" else 0
        self.sampler = Sampler(submit, depth)

    def sync_weights(self) -> None:
        """Ask the learner for its weights (at the start and on resume; after an update they
        come with its reply, `learn`); they go to the runners with the next collection call
        (take_weights). A future: nobody waits, Ray hands it from learner to runners."""
        self.weights = (self.groups.learner.get_weights(), self.version)

    def take_weights(self) -> tuple[Any, int | None]:
        """The arguments (weights, version) of the next collection call: (None, None) when
        the runners already hold the newest weights."""
        weights, self.weights = self.weights, None
        return weights if weights is not None else (None, None)

    def consume(self, batch: DataProto) -> dict[str, Any]:
        """Count a collected batch; its episode lists and policy lag as metrics."""
        meta = batch.meta_info
        self.env_steps += int(meta["env_steps"])
        lag = (self.version - batch.batch["policy_version"]).double()
        return {"episode_returns": list(meta["episode_returns"]), "episode_lengths": list(meta["episode_lengths"]),
                "policy/lag_mean": float(lag.mean()), "policy/lag_max": float(lag.max())}


@contextlib.contextmanager
def phase(metrics: dict[str, Any], name: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    metrics[f"timing_s/{name}"] = time.perf_counter() - start


def learn(run: EnvRun, metrics: dict[str, Any], update: Callable[[], tuple[dict[str, float], Any]]) -> None:
    """The phases every program ends with: the learner's update (its metrics and new acting
    weights, workers/learner.py), then the weights are handed to the next collection call."""
    with phase(metrics, "update"):
        values, weights = update()
        metrics.update(values)
    run.version += 1
    with phase(metrics, "sync"):
        run.weights = (weights, run.version)


# ----------------------------------------------------------------------------- PPO


def ppo_submit(run: EnvRun) -> Callable[[], Any]:
    def submit() -> Any:
        run.submitted_steps += steps_per_iteration(run.cfg)
        return run.groups.runners.rollout(run.cfg.ppo.rollout_steps, *run.take_weights())

    return submit


def ppo_iteration(run: EnvRun) -> dict[str, Any]:
    metrics: dict[str, Any] = {}
    with phase(metrics, "collect"):
        segment = run.sampler.next()
    lr = ppo_lr(run.cfg, run.env_steps, run.horizon)
    metrics.update(run.consume(segment))
    with phase(metrics, "adv"):
        batch = ppo_batch(segment, run.cfg, lr)
    learn(run, metrics, lambda: run.groups.learner.ppo_update(batch)[0])
    return metrics


def ppo_lr(cfg: EnvRunConfig, env_steps_done: int, horizon: int) -> float:
    """The step size of the next update: constant, or decayed linearly to 0 at `horizon` steps."""
    if cfg.ppo.lr_schedule == "constant":
        return cfg.ppo.lr
    return cfg.ppo.lr * max(0.0, 1.0 - env_steps_done / max(horizon, 1))


def ppo_batch(segment: DataProto, cfg: EnvRunConfig, lr: float) -> DataProto:
    """GAE on the [envs, time] segment, then one row per environment step for the learner."""
    b = segment.batch
    advantages, returns = compute_env_gae(b["rewards"], b["values"], b["next_values"], b["terminated"], b["dones"],
                                          gamma=cfg.ppo.gamma, lam=cfg.ppo.gae_lambda)
    columns = {"observations": b["observations"], "actions": b["actions"], "old_log_probs": b["old_log_probs"],
               "values": b["values"], "advantages": advantages, "returns": returns}
    flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in columns.items()}
    return DataProto.from_dict(flat, meta_info={"lr": lr})


# ----------------------------------------------------------------------------- SAC


def sac_submit(run: EnvRun) -> Callable[[], Any]:
    def submit() -> Any:
        # Uniform actions until learning_starts steps were asked for (decided at submission,
        # so sync and async runs draw the same warm-up).
        random = run.submitted_steps < run.cfg.sac.learning_starts
        run.submitted_steps += steps_per_iteration(run.cfg)
        return run.groups.runners.transitions(run.cfg.sac.train_freq, random, *run.take_weights())

    return submit


def sac_iteration(run: EnvRun) -> dict[str, Any]:
    metrics: dict[str, Any] = {}
    cfg = run.cfg.sac
    with phase(metrics, "collect"):
        batch = run.sampler.next()
    metrics.update(run.consume(batch))
    transitions = batch.select(TRANSITION_KEYS, meta_info_keys=[])
    if run.env_steps > cfg.learning_starts:
        steps = sac_gradient_steps(cfg.gradient_steps, cfg.train_freq, int(batch.meta_info["env_steps"]))
        learn(run, metrics, lambda: run.groups.learner.sac_train(transitions, steps)[0])
    else:
        with phase(metrics, "store"):  # warm-up: only fill the replay buffer
            run.groups.learner.sac_train(transitions, 0)
    return metrics


def sac_gradient_steps(gradient_steps: int, train_freq: int, env_steps: int) -> int:
    """Gradient steps for `env_steps` new transitions: gradient_steps per train_freq steps
    of each environment copy, so the update-to-data ratio gradient_steps / train_freq is
    the configured one whatever the number of runners and copies (8 runners collect 8
    times the steps of one per iteration, and get 8 times the updates); -1: one per step."""
    if gradient_steps < 0:
        return env_steps
    return max(1, gradient_steps * env_steps // train_freq)


# ----------------------------------------------------------------------------- programs


@dataclass(frozen=True)
class EnvProgram:
    """An environment algorithm's program (the `program` of its registry row).

    submit(run) -> a function that asks the runners for the next collection (a future);
    iteration(run) -> metrics: one iteration on the controller;
    acting_model: the network class the env runners act with, built from the NetworkSpec;
    build_learner(network, update, seed): one learner rank's learner;
    update_config(section, ranks): its per-rank `update` from the algorithm's config section.
    """

    submit: Callable[[EnvRun], Callable[[], Any]]
    iteration: Callable[[EnvRun], dict[str, Any]]
    acting_model: type
    build_learner: Callable[..., Any]
    update_config: Callable[[Any, int], Any]


def ppo_update_config(p: PPOSection, ranks: int) -> PPOUpdateConfig:
    return PPOUpdateConfig(lr=p.lr, epochs=p.epochs, minibatch_size=p.minibatch_size // ranks,
                           max_grad_norm=p.max_grad_norm, target_kl=p.target_kl,
                           loss=PPOLossConfig(clip_ratio=p.clip_ratio, clip_value=p.clip_value, vf_coef=p.vf_coef,
                                              ent_coef=p.ent_coef, normalize_advantages=p.normalize_advantages))


def sac_update_config(s: SACSection, ranks: int) -> SACUpdateConfig:
    return SACUpdateConfig(lr=s.lr, batch_size=s.batch_size // ranks, gamma=s.gamma, tau=s.tau, autotune=s.autotune,
                           alpha=s.init_alpha, target_entropy=s.target_entropy,
                           buffer_capacity=max(1, s.buffer_size // ranks))


PPO = EnvProgram(ppo_submit, ppo_iteration, ActorCritic, build_ppo_learner, ppo_update_config)
SAC = EnvProgram(sac_submit, sac_iteration, SACModel, build_sac_learner, sac_update_config)
