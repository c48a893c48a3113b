"""The asynchronous trainer modes: generation on its own pool, overlapped with training."""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray

from hybridflow.config.schema import RunConfig
from hybridflow.controller import CallFuture, RoleSpec, WorkerError, WorkerGroup
from hybridflow.protocol import DataProto
from hybridflow.trainer.programs.algorithms import AlgoState, group_unit, rule_reward_manager
from hybridflow.trainer.modes.stream_step import train_on_groups
from hybridflow.trainer.programs.phases import Roles, Step, groups_to_train
from hybridflow.trainer.run.setup import actor_config, build_cost_manager, build_reward_manager
from hybridflow.workers import PlacementSpec, build_role_groups, shutdown_role_groups
from hybridflow.workers.rollout import RolloutWorker, connect_weight_bridge

PROMPTS_FILE = "async_prompts.dp"  # in a checkpoint: the prompts sent but not trained yet


@dataclass(frozen=True)
class Group:
    """A finished prompt group as the controller knows it: the steering record the rollout
    pool sent, and the ref of its samples in the object store (never fetched here)."""

    uid: str
    oldest_version: int  # policy version of its oldest response token
    ref: ray.ObjectRef | None = None
    informative: bool | None = None  # its scores differ (None: not scored on the rollout pool)


class RolloutBuffer:
    """A bounded FIFO of finished prompt groups; groups staler than `max_staleness` are
    dropped (and counted) when a batch is taken."""

    def __init__(self, capacity: int, max_staleness: int) -> None:
        self.capacity, self.max_staleness = capacity, max_staleness
        self.groups: deque[Group] = deque()
        self.dropped = 0  # groups, over the whole run
        self.discarded: list[Group] = []  # dropped since the owner last cleared it

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
        self.discarded.extend(g for g in self.groups if version - g.oldest_version > self.max_staleness)
        self.dropped += len(self.groups) - len(fresh)
        self.groups = fresh
        if len(fresh) < count:
            return None
        return [self.groups.popleft() for _ in range(count)]


class AsyncRunner:
    """Drives the rollout pool and hands the trainer one batch per step (see module docstring)."""

    def __init__(self, cfg: RunConfig, roles: Roles, rollout: WorkerGroup, prompts: Iterator[DataProto],
                 state: AlgoState) -> None:
        a = cfg.async_rl.of_mode(cfg.trainer.mode)
        self.cfg, self.roles, self.rollout, self.prompts, self.state = cfg, roles, rollout, prompts, state
        self.batch_groups = cfg.data.train_batch_size
        self.max_staleness = a.max_staleness
        self.chunk = a.chunk(self.batch_groups)
        self.max_steps = a.steps_per_call
        self.buffer = RolloutBuffer(a.buffer_size, self.max_staleness)
        self.tp = cfg.rollout.tensor_model_parallel_size
        self.version = 0  # updates done; the rollout pool holds this version after the pending sync
        self.sent = self.in_flight = self.calls = 0
        self.pending: deque[CallFuture] = deque()
        self.sync: CallFuture | None = None
        self.leftover: DataProto | None = None
        self.untrained: dict[str, DataProto] = {}  # uid -> its prompt row: sent, not trained nor dropped yet
        self.sync_metrics: dict[str, float] = {}
        self.receive_metrics: dict[str, float] = {}  # the latest weight sync a generation call loaded
        self.restarts: dict[str, float] = {}  # the rollout pool's scoring-process restarts since the last step
        # DAPO's filter: groups whose scores are all equal are discarded on arrival; a step that
        # has received `sampling_cap` groups without filling its batch trains on what it has (_wanted).
        filter_groups = cfg.algorithm.settings.filter_groups if cfg.algorithm.spec.dynamic_sampling else None
        self.sampling_cap = (1 + filter_groups.max_extra_rounds) * self.batch_groups \
            if filter_groups is not None and filter_groups.enable else None
        self.filtered = 0  # groups discarded by dynamic sampling, over the whole run
        self.received = self.informative = 0  # groups that arrived since the last step, and those kept

    @classmethod
    def start(cls, cfg: RunConfig, roles: Roles, policy_path: str, prompts: Iterator[DataProto],
              state: AlgoState, cpus_per_slot: float) -> tuple[AsyncRunner, WorkerGroup]:
        """Build the rollout pool (`cpus_per_slot`: each rank's CPUs, as the actor's ranks get)
        and connect it to the actor. The first step sends the actor's weights (after a
        resume, the checkpoint's) as the current version."""
        spec = PlacementSpec(pools={"rollout_pool": [cfg.async_rl.rollout_ranks]}, use_gpu=cfg.resources.use_gpu,
                             cpus_per_slot=cpus_per_slot)
        # The rollout ranks score with the run's own rule-based reward, built in each process.
        tokenizer = roles.reward.tokenizer
        reward_fn = (functools.partial(build_reward_manager, cfg, tokenizer)
                     if rule_reward_manager(roles, cfg) is not None else None)
        cost_fn = functools.partial(build_cost_manager, cfg, tokenizer) if roles.cost_fn is not None else None
        worker = RoleSpec(RolloutWorker, (actor_config(cfg, policy_path), reward_fn, cost_fn,
                                          cfg.algorithm.spec.greedy_baseline))
        groups = build_role_groups({"rollout": worker}, spec)
        rollout = groups["rollout"]
        try:
            rollout.init_model()
            connect_weight_bridge(roles.actor, rollout, cfg.async_rl.bucket_bytes)
            runner = cls(cfg, roles, rollout, prompts, state)
        except BaseException:
            shutdown_role_groups(groups)
            raise
        return runner, rollout

    # ------------------------------------------------------------------ generation
    def _may_send(self) -> bool:
        # Dropped groups were never trained: their place in the schedule goes to new prompts.
        limit = (self.version + self.max_staleness + 1) * self.batch_groups
        room = self.buffer.capacity - len(self.buffer) - self.in_flight
        return self.sent - self.buffer.dropped - self.filtered + self.chunk <= limit and self.chunk <= room

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
            uids = [f"g{self.calls}-{i}" for i in range(len(prompts))]
            self.untrained.update((uid, prompts[i:i + 1]) for i, uid in enumerate(uids))  # as the loader gave them
            prompts.non_tensor_batch["uid"] = np.array(uids, dtype=object)
            parts = prompts.chunk(world // self.tp)  # contiguous, in generation dp order (as the sync actor)
            per_rank = [parts[rank // self.tp] for rank in range(world)]
            self.sent += len(prompts)
            self.in_flight += len(prompts)
            self.calls += 1
        self.pending.append(self.rollout.generate_stream(per_rank, [self.max_steps] * world, [self.version] * world))

    def _fill(self) -> None:
        while self._may_send():
            self._send(self._next_prompts())
        if self.in_flight and not self.pending:
            self._send(None)  # keep the pool generating while the trainer trains

    def _receive(self) -> None:
        """Take the next generation call's result: group refs and steering records only."""
        outputs = self.pending.popleft().get()
        for rank in range(0, len(outputs), self.tp):  # tp rank 0 of each generation group, dp order
            refs, steering = outputs[rank]
            metrics = steering["metrics"]
            for key in [k for k in metrics if k.endswith("/worker_restarts")]:
                self.restarts[key] = self.restarts.get(key, 0.0) + metrics.pop(key)
            if rank == 0 and metrics:  # the weight sync this call loaded (every rank loads the same)
                self.receive_metrics = metrics
            for ref, info in zip(refs, steering["groups"], strict=True):
                self.in_flight -= 1
                self.received += 1
                group = Group(info["uid"], info["oldest_version"], ref, info["informative"])
                if self.sampling_cap is not None and not group.informative:
                    self.filtered += 1  # all-equal scores: no signal; its place goes to new prompts
                    del self.untrained[group.uid]
                    continue
                self.informative += 1
                self.buffer.put(group)

    # ------------------------------------------------------------------ a step
    def _next_batch(self) -> list[Group]:
        while True:
            groups = self.buffer.take(self._wanted(), self.version)
            for group in [*self.buffer.discarded, *(groups or [])]:
                del self.untrained[group.uid]
            self.buffer.discarded.clear()
            if groups is not None:
                return groups
            self._fill()
            if self.pending:
                self._receive()
            elif self.in_flight:
                self._send(None)  # no room for new prompts: let the in-flight ones finish
            elif self.sampling_cap is not None and self.chunk <= self.buffer.capacity - len(self.buffer):
                # Discarded groups left the batch short with nothing in flight: admission counts
                # the buffered groups as trained at once, so it would wait forever. Send more; the
                # drop rule still bounds staleness (as sync DAPO's next round).
                self._send(self._next_prompts())
            else:
                raise RuntimeError(f"the asynchronous trainer stalled: {len(self.buffer)} groups buffered, none in "
                                   f"flight, none may be sent (version {self.version}); raise async_rl.buffer_size")

    def _wanted(self) -> int:
        """Groups the step trains on: data.train_batch_size, unless dynamic sampling has
        received its cap of groups for this step; then the informative groups buffered, cut
        to whole actor mini-batches (as the synchronous DAPO step does after its last round)."""
        if self.sampling_cap is None or self.received < self.sampling_cap:
            return self.batch_groups
        self.buffer.take(0, self.version)  # drops the stale ones first
        return groups_to_train(len(self.buffer), self.batch_groups, group_unit(self.cfg),
                               f"received {self.received} groups for this step and kept {self.informative}")

    def step(self, index: int, on_phase: Callable[[str], None] | None = None) -> Step:
        """One training step on the next batch of fresh groups; returns it with its metrics.
        `on_phase` is told each phase's name as it starts (Step.on_phase): wait_rollout, then the program's.

        A failure in either pool raises a WorkerError naming the pool whose process died,
        if one did (its peer's error, e.g. a broken weight-sync connection, is the symptom)."""
        try:
            return self._step(index, on_phase)
        except WorkerError as err:
            raise self.root_cause(err) from err

    def root_cause(self, err: WorkerError) -> WorkerError:
        """`err`, or, where a pool's process is gone, the error naming that death: a failure
        seen elsewhere (a peer's broken weight-sync connection, a call queued behind it on the
        same process, e.g. the step's checkpoint) is its symptom."""
        for role, group in (("rollout", self.rollout), ("actor", self.roles.actor)):
            dead = dead_ranks(group)
            if dead:
                info = group.worker_info[dead[0]]
                return WorkerError(
                    f"the {role} pool's rank {dead[0]} (pid {info['pid']}) died; the run stops. The error seen first "
                    f"was: {err}", role=role, rank=dead[0], node=info["ip"], pid=info["pid"], method=err.method,
                    died=True)
        return err

    def _step(self, index: int, on_phase: Callable[[str], None] | None) -> Step:
        step = Step(index, DataProto(), balance_dp=self.cfg.trainer.balance_batch,
                    concurrent=self.cfg.trainer.concurrent_phases, on_phase=on_phase)
        dropped_before = self.buffer.dropped
        if self.sync is None:  # the first step of a run, or of a resumed one
            self.sync = self.roles.actor.send_weights(self.version)
        if on_phase is not None:
            on_phase("wait_rollout")
        start = time.perf_counter()
        groups = self._next_batch()
        step.metrics["timing_s/wait_rollout"] = time.perf_counter() - start
        if self.sampling_cap is not None:
            step.metrics.update({"dapo/generated_groups": float(self.received), "dapo/kept_groups": float(self.informative),
                                 "dapo/trained_groups": float(len(groups)),
                                 "dapo/cap_hit": float(len(groups) < self.batch_groups),
                                 "dapo/filtered_groups_total": float(self.filtered)})
        self.received = self.informative = 0
        train_on_groups(step, self.roles, self.cfg, self.state, [g.ref for g in groups], self.version,
                        self.restarts)
        self.restarts = {}
        # The previous weight send is done once the rollout ranks' receiver threads took the
        # bytes (unless a pool failed: then this raises).
        start = time.perf_counter()
        self.sync_metrics = {**self.sync.get()[0], "timing_s/weight_sync_wait": time.perf_counter() - start}
        self.version += 1
        self.sync = self.roles.actor.send_weights(self.version)  # the rollout ranks take it at once
        self._fill()  # new prompts queue behind the sync: they start under the new weights
        step.metrics.update({
            "async/policy_version": float(self.version), "async/dropped_groups": float(self.buffer.dropped - dropped_before),
            "async/dropped_groups_total": float(self.buffer.dropped), "async/buffered_groups": float(len(self.buffer)),
            "async/in_flight_groups": float(self.in_flight), "async/queued_calls": float(len(self.pending)),
            **self.receive_metrics, **self.sync_metrics,
        })
        return step

    # ------------------------------------------------------------------ checkpoints
    def save_state(self, checkpoint_dir: Path) -> dict[str, Any]:
        """What a resumed run needs (the trainer saves it with the step's checkpoint): the
        policy version, the generation calls made (the rollout ranks' sampling seeds count
        them), the dropped total, and, in `PROMPTS_FILE`, the prompts sent but not trained
        (in flight or buffered, in the order they were sent) followed by the rest of a
        loader batch cut across calls. The generated groups themselves are not saved: a
        resumed run sends those prompts again first (regenerated under the checkpoint's
        weights), then continues from the loader's saved position."""
        rows = [*self.untrained.values(), *([self.leftover] if self.leftover is not None else [])]
        if rows:
            DataProto.concat(rows).save(checkpoint_dir / PROMPTS_FILE)
        return {"version": self.version, "calls": self.calls, "dropped_total": self.buffer.dropped,
                "filtered_total": self.filtered, "requeued_prompts": sum(len(r) for r in rows)}

    def load_state(self, state: dict[str, Any], checkpoint_dir: Path) -> None:
        """Continue from `save_state`'s record (before the first step of the resumed run)."""
        self.version, self.calls, self.buffer.dropped = state["version"], state["calls"], state["dropped_total"]
        self.filtered = state.get("filtered_total", 0)  # absent in checkpoints written before dynamic sampling
        # the trained, the dropped and the filtered groups
        self.sent = self.version * self.batch_groups + self.buffer.dropped + self.filtered
        path = checkpoint_dir / PROMPTS_FILE
        self.leftover = DataProto.load(path) if state["requeued_prompts"] else None
        if self.leftover is not None and len(self.leftover) != state["requeued_prompts"]:
            raise ValueError(f"{str(path)!r} holds {len(self.leftover)} prompts, the checkpoint's state says "
                             f"{state['requeued_prompts']}: the checkpoint is damaged")
        self.rollout.restore_generate_calls(self.calls)


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
