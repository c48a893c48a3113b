"""The phases of an environment-task step (one iteration), named functions over worker groups.

    collect(step, run, request)      # the env runners' next batch (in flight already with async sampling)
    compute_env_gae(step, cfg, lr)   # on the controller: GAE on the [envs, time] segment, flat rows
    update_learner(step, learner, "ppo_update", run)   # the learner's update, then its weights to the runners
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hybridflow.algorithms.env_advantages import compute_env_gae as env_gae
from hybridflow.config.env_algorithms import steps_per_iteration
from hybridflow.controller import WorkerGroup
from hybridflow.protocol import DataProto
from hybridflow.trainer.programs.phases import Step, phase


class Sampler:
    """Collections in flight (futures, or batches restored from a checkpoint), oldest first."""

    def __init__(self, depth: int) -> None:
        self.depth = depth  # 0: sync; k: up to k collections run while the learner updates
        self.pending: deque[Any] = deque()

    def next(self, submit: Callable[[], Any]) -> DataProto:
        while len(self.pending) <= self.depth:
            self.pending.append(submit())
        item = self.pending.popleft()
        return item if isinstance(item, DataProto) else item.get()

    def drain(self) -> list[DataProto]:
        """Wait for every collection in flight and keep the batches (a checkpoint saves them)."""
        self.pending = deque(item if isinstance(item, DataProto) else item.get() for item in self.pending)
        return list(self.pending)


@dataclass
class EnvRun:
    """What the environment programs carry across steps; checkpoints save its counters."""

    cfg: Any
    sampler: Sampler = field(default_factory=lambda: Sampler(0))
    horizon: int = 0  # environment steps a linear lr schedule decays over
    version: int = 0  # learner updates done = the policy version the runners catch up to
    env_steps: int = 0  # environment steps of the batches consumed so far
    submitted_steps: int = 0  # environment steps asked of the runners (consumed + in flight)
    weights: tuple[Any, int] | None = None  # (future of the learner's weights, version) not yet sent

    def __post_init__(self) -> None:
        dist = self.cfg.distributed
        self.sampler = Sampler(dist.max_policy_lag if dist.sampling == "async" else 0)

    def send_weights_of(self, learner: WorkerGroup) -> None:
        """Ask the learner for its weights (at the start and on resume; after an update they
        come with its reply); they go to the runners with the next collection call."""
        self.weights = (learner.get_weights(), self.version)

    def take_weights(self) -> tuple[Any, int | None]:
        """The arguments (weights, version) of the next collection call: (None, None) when
        the runners already hold the newest weights."""
        weights, self.weights = self.weights, None
        return weights if weights is not None else (None, None)

    def submitted(self) -> None:
        self.submitted_steps += steps_per_iteration(self.cfg)

    def state_dict(self) -> dict[str, int]:
        return {"env_steps": self.env_steps, "submitted_steps": self.submitted_steps, "policy_version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.version, self.env_steps = int(state["policy_version"]), int(state["env_steps"])
        self.submitted_steps = int(state["submitted_steps"])


@phase("collect")
def collect(step: Step, run: EnvRun, request: Callable[[], Any], keep: tuple[str, ...] | None = None) -> None:
    """step.batch: the runners' next collection (`request()` submits one: a future), cut to
    the tensors `keep` (None: all); its episodes and policy lag as metrics."""
    def submit() -> Any:
        future = request()
        run.submitted()
        return future

    step.batch = run.sampler.next(submit)
    meta = step.batch.meta_info
    run.env_steps += int(meta["env_steps"])
    lag = (run.version - step.batch.batch["policy_version"]).double()
    step.metrics.update({"episode_returns": list(meta["episode_returns"]),
                         "episode_lengths": list(meta["episode_lengths"]),
                         "policy/lag_mean": float(lag.mean()), "policy/lag_max": float(lag.max())})
    if keep is not None:
        step.batch = step.batch.select(keep, meta_info_keys=["env_steps"])


@phase("adv")
def compute_env_gae(step: Step, ppo: Any, lr: float) -> None:
    """GAE on the [envs, time] segment (algorithms/env_advantages.py), then one row per
    environment step for the learner, with the step size `lr` of its update."""
    b = step.batch.batch
    advantages, returns = env_gae(b["rewards"], b["values"], b["next_values"], b["terminated"], b["dones"],
                                  gamma=ppo.gamma, lam=ppo.gae_lambda)
    columns = {"observations": b["observations"], "actions": b["actions"], "old_log_probs": b["old_log_probs"],
               "values": b["values"], "advantages": advantages, "returns": returns}
    flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in columns.items()}
    step.batch = DataProto.from_dict(flat, meta_info={"lr": lr})


def update_learner(step: Step, learner: WorkerGroup, method: str, run: EnvRun, *args: Any) -> None:
    """The learner's `method` on step.batch (its metrics and new acting weights,
    workers/learner.py), then the weights are handed to the next collection call."""
    weights = _update(step, learner, method, run, *args)
    _sync(step, run, weights)


@phase("update")
def _update(step: Step, learner: WorkerGroup, method: str, run: EnvRun, *args: Any) -> Any:
    metrics, weights = getattr(learner, method)(step.batch, *args)[0]
    step.metrics.update(metrics)
    run.version += 1
    return weights


@phase("sync")
def _sync(step: Step, run: EnvRun, weights: Any) -> None:
    run.weights = (weights, run.version)


@phase("store")
def store_transitions(step: Step, learner: WorkerGroup) -> None:
    """Off-policy warm-up: only fill the replay buffer (no update, no new weights)."""
    learner.sac_train(step.batch, 0)


def ppo_lr(cfg: Any, run: EnvRun) -> float:
    """The step size of the next update: constant, or decayed linearly to 0 at run.horizon steps."""
    if cfg.ppo.lr_schedule == "constant":
        return cfg.ppo.lr
    return cfg.ppo.lr * max(0.0, 1.0 - run.env_steps / max(run.horizon, 1))


def sac_gradient_steps(gradient_steps: int, train_freq: int, env_steps: int) -> int:
    """Gradient steps for `env_steps` new transitions (a batch's meta_info["env_steps"]): gradient_steps per train_freq steps
    of each environment copy, so the update-to-data ratio gradient_steps / train_freq is
    the configured one whatever the number of runners and copies (8 runners collect 8
    times the steps of one per iteration, and get 8 times the updates); -1: one per step."""
    if gradient_steps < 0:
        return env_steps
    return max(1, gradient_steps * env_steps // train_freq)
