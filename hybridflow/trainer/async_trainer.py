"""The asynchronous trainer modes: generation on its own pool, overlapped with training.

`trainer.mode` (docs/async.md):

- one_step_off: the rollout pool generates batch k+1 while the actor trains on batch k;
  weights move once per step (every sample is exactly one version stale after the first).
- async: the rollout pool streams finished prompt groups (the rollout.n samples of one
  prompt, kept together) into a bounded `RolloutBuffer`; the trainer takes a batch as
  soon as data.train_batch_size fresh groups are there. Generation calls run at most
  async_rl.steps_per_call scheduler iterations, so new weights reach in-flight sequences
  between calls (partial rollouts: they continue under the new weights, KV recomputed).

What bounds staleness: admission control and a drop rule. New prompts are sent to the
rollout pool only while the groups sent so far (less those dropped) would all be trained
within max_staleness versions if they finish in order (sent <= (version + s + 1) * batch) and
the buffer plus the groups in flight fit async_rl.buffer_size. A group that finishes
late (long tail) and whose oldest token is more than s versions behind the update that
would train it is dropped and counted (async/dropped_groups). With s = 0 the pool only
ever generates the next batch with the current weights, as the synchronous loop does,
and a run reproduces sync mode's metrics for the same seed (tests/trainer/test_async_modes.py).

The controller steers and does not carry weights: generation calls and weight syncs are
non-blocking worker-group calls (CallFutures); weights go from training rank 0 to the
rollout ranks over a WeightBridge (torch.distributed). It does fetch the finished groups,
to score them with the reward function and to compute advantages (both run on the
controller in this framework), then trains with the sync program's own phases
(`train_critic_free`). Ray runs a group's calls in the order they were issued, so a
weight sync issued before a generation call is in place when that call starts.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import ray

from hybridflow.algorithms.off_policy import staleness_metrics
from hybridflow.config.schema import RunConfig
from hybridflow.controller import CallFuture, RoleSpec, WorkerError, WorkerGroup
from hybridflow.engines.rollout.partial import POLICY_VERSION
from hybridflow.protocol import DataProto
from hybridflow.trainer import phases as P
from hybridflow.trainer.algorithms import AlgoState, _model_weight, _rule_reward, train_critic_free
from hybridflow.trainer.phases import Roles, Step
from hybridflow.trainer.setup import actor_config
from hybridflow.workers import PlacementSpec, build_role_groups, shutdown_role_groups
from hybridflow.workers.rollout import RolloutWorker, connect_weight_bridge, start_weight_sync


@dataclass
class Group:
    """The samples of one prompt, and the policy version of their oldest token."""

    data: DataProto
    oldest_version: int


def split_groups(batch: DataProto) -> list[Group]:
    """The prompt groups of a generated batch (samples of one uid are adjacent), in order."""
    uids = batch.non_tensor_batch["uid"]
    starts = [0] + [i for i in range(1, len(uids)) if uids[i] != uids[i - 1]] + [len(uids)]
    groups = []
    for a, b in zip(starts[:-1], starts[1:]):
        part = batch[a:b]
        versions = part.batch[POLICY_VERSION][part.batch["response_mask"].bool()]
        groups.append(Group(part, int(versions.min())))
    return groups


class RolloutBuffer:
    """A bounded FIFO of finished prompt groups; groups staler than `max_staleness` are
    dropped (and counted) when a batch is taken."""

    def __init__(self, capacity: int, max_staleness: int) -> None:
        self.capacity, self.max_staleness = capacity, max_staleness
        self.groups: deque[Group] = deque()
        self.dropped = 0  # groups, over the whole run

    def __len__(self) -> int:
        return len(self.groups)

    def put(self, group: Group) -> None:
        if len(self.groups) >= self.capacity:
            raise RuntimeError(f"rollout buffer overflow ({self.capacity} groups): admission control let too many "
                               "groups in flight")
        self.groups.append(group)

    def take(self, count: int, version: int) -> list[Group] | None:
        """The oldest `count` groups fit for training at `version` (staleness = version -
        oldest token's version <= max_staleness), or None while fewer are there. Staler
        groups are dropped first, whether or not a batch can be taken."""
        fresh = deque(g for g in self.groups if version - g.oldest_version <= self.max_staleness)
        self.dropped += len(self.groups) - len(fresh)
        self.groups = fresh
        if len(fresh) < count:
            return None
        return [self.groups.popleft() for _ in range(count)]


class AsyncRunner:
    """Drives the rollout pool and hands the trainer one batch per step (see module docstring)."""

    def __init__(self, cfg: RunConfig, roles: Roles, rollout: WorkerGroup, prompts: Iterator[DataProto],
                 state: AlgoState) -> None:
        a, mode = cfg.async_rl, cfg.trainer.mode
        self.cfg, self.roles, self.rollout, self.prompts, self.state = cfg, roles, rollout, prompts, state
        self.batch_groups = cfg.data.train_batch_size
        self.max_staleness = 1 if mode == "one_step_off" else a.max_staleness
        self.chunk = self.batch_groups if mode == "one_step_off" else a.chunk(self.batch_groups)
        self.max_steps = None if mode == "one_step_off" else a.steps_per_call
        self.buffer = RolloutBuffer(a.buffer_size, self.max_staleness)
        self.tp = cfg.rollout.tensor_model_parallel_size
        self.version = 0  # updates done; the rollout pool holds this version after the pending sync
        self.sent = self.in_flight = self.calls = 0
        self.pending: deque[CallFuture] = deque()
        self.syncs: list[CallFuture] = []
        self.leftover: DataProto | None = None
        self.sync_metrics: dict[str, float] = {}

    @classmethod
    def start(cls, cfg: RunConfig, roles: Roles, policy_path: str, prompts: Iterator[DataProto],
              state: AlgoState, cpus_per_slot: float) -> tuple[AsyncRunner, WorkerGroup]:
        """Build the rollout pool (`cpus_per_slot`: each rank's CPUs, as the actor's ranks get),
        connect it to the actor and give it version 0."""
        spec = PlacementSpec(pools={"rollout_pool": [cfg.async_rl.rollout_ranks]}, use_gpu=cfg.resources.use_gpu,
                             cpus_per_slot=cpus_per_slot)
        groups = build_role_groups({"rollout": RoleSpec(RolloutWorker, (actor_config(cfg, policy_path),))}, spec)
        rollout = groups["rollout"]
        try:
            rollout.init_model()
            connect_weight_bridge(roles.actor, rollout, cfg.async_rl.bucket_bytes)
            runner = cls(cfg, roles, rollout, prompts, state)
            runner.syncs = list(start_weight_sync(roles.actor, rollout, 0))
        except BaseException:
            shutdown_role_groups(groups)
            raise
        return runner, rollout

    # ------------------------------------------------------------------ generation
    def _may_send(self) -> bool:
        # Dropped groups were never trained: their place in the schedule goes to new prompts.
        limit = (self.version + self.max_staleness + 1) * self.batch_groups
        room = self.buffer.capacity - len(self.buffer) - self.in_flight
        return self.sent - self.buffer.dropped + self.chunk <= limit and self.chunk <= room and len(self.pending) < 2

    def _next_prompts(self) -> DataProto:
        """`chunk` prompts from the loader's batches (a batch may be cut across calls)."""
        parts, have = [], 0
        while have < self.chunk:
            if self.leftover is None:
                self.leftover = next(self.prompts)
            take = min(self.chunk - have, len(self.leftover))
            parts.append(self.leftover[:take])
            self.leftover = self.leftover[take:] if take < len(self.leftover) else None
            have += take
        return parts[0] if len(parts) == 1 else DataProto.concat(parts)

    def _send(self, prompts: DataProto | None) -> None:
        world = self.rollout.world_size
        per_rank: list[DataProto | None] = [None] * world
        if prompts is not None:
            prompts.non_tensor_batch["uid"] = np.array([f"g{self.calls}-{i}" for i in range(len(prompts))],
                                                       dtype=object)
            parts = prompts.chunk(world // self.tp)  # contiguous, in generation dp order (as the sync actor)
            per_rank = [parts[rank // self.tp] for rank in range(world)]
            self.sent += len(prompts)
            self.in_flight += len(prompts)
            self.calls += 1
        self.pending.append(self.rollout.generate_stream(per_rank, [self.max_steps] * world))

    def _fill(self) -> None:
        while self._may_send():
            self._send(self._next_prompts())

    def _receive(self) -> None:
        outputs = self.pending.popleft().get()
        for rank in range(0, len(outputs), self.tp):  # tp rank 0 of each generation group, dp order
            for batch in outputs[rank]:
                for group in split_groups(batch):
                    self.buffer.put(group)
                    self.in_flight -= 1

    # ------------------------------------------------------------------ a step
    def _next_batch(self) -> list[Group]:
        while True:
            groups = self.buffer.take(self.batch_groups, self.version)
            if groups is not None:
                return groups
            self._fill()
            if self.pending:
                self._receive()
            elif self.in_flight:
                self._send(None)  # no room for new prompts: let the in-flight ones finish
            else:
                raise RuntimeError(f"the asynchronous trainer stalled: {len(self.buffer)} groups buffered, none in "
                                   f"flight, none may be sent (version {self.version}); raise async_rl.buffer_size")

    def step(self, index: int) -> Step:
        """One training step on the next batch of fresh groups; returns it with its metrics.

        A failure in either pool raises a WorkerError naming the pool whose process died,
        if one did (its peer's error, e.g. a broken weight-sync connection, is the symptom)."""
        try:
            return self._step(index)
        except WorkerError as err:
            raise self._root_cause(err) from err

    def _root_cause(self, err: WorkerError) -> WorkerError:
        for role, group in (("rollout", self.rollout), ("actor", self.roles.actor)):
            dead = dead_ranks(group)
            if dead:
                info = group.worker_info[dead[0]]
                return WorkerError(
                    f"the {role} pool's rank {dead[0]} (pid {info['pid']}) died; the run stops. The error seen first "
                    f"was: {err}", role=role, rank=dead[0], node=info["ip"], pid=info["pid"], method=err.method,
                    died=True)
        return err

    def _step(self, index: int) -> Step:
        step = Step(index, DataProto(), balance_dp=self.cfg.trainer.balance_batch)
        dropped_before = self.buffer.dropped
        start = time.perf_counter()
        groups = self._next_batch()
        step.metrics["timing_s/wait_rollout"] = time.perf_counter() - start
        step.batch = P.concat_generated([g.data for g in groups])
        mask = step.batch.batch["response_mask"]
        step.metrics.update(staleness_metrics(step.batch.batch[POLICY_VERSION], mask, self.version))
        P.compute_reward(step, _rule_reward(self.roles, self.cfg), self.roles.reward_model, _model_weight(self.cfg))
        train_critic_free(step, self.roles, self.cfg, self.state)
        self._finish_syncs()
        self.version += 1
        self.syncs = list(start_weight_sync(self.roles.actor, self.rollout, self.version))
        self._fill()  # new prompts queue behind the sync: they start under the new weights
        step.metrics.update({
            "async/policy_version": float(self.version), "async/dropped_groups": float(self.buffer.dropped - dropped_before),
            "async/dropped_groups_total": float(self.buffer.dropped), "async/buffered_groups": float(len(self.buffer)),
            "async/in_flight_groups": float(self.in_flight), **self.sync_metrics,
        })
        return step

    def _finish_syncs(self) -> None:
        """Collect the previous weight sync (long done unless a pool failed: then this raises)."""
        start = time.perf_counter()
        sent, received = (future.get() for future in self.syncs)
        self.sync_metrics = {**received[0], **sent[0], "timing_s/weight_sync_wait": time.perf_counter() - start}

    def close(self) -> None:
        """Wait for nothing: the groups are killed by the trainer's close."""
        self.pending.clear()
        self.syncs = []


def dead_ranks(group: WorkerGroup, timeout_s: float = 5.0) -> list[int]:
    """Ranks of `group` whose process is gone (a busy rank counts as alive)."""
    refs = [actor.__ray_ready__.remote() for actor in group.workers]
    dead = []
    for rank, ref in enumerate(refs):
        try:
            ray.get(ref, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            pass
        except ray.exceptions.RayActorError:
            dead.append(rank)
    return dead
