"""The environment task kind's part of the one lifecycle (trainer/task.py: `Task`).

    trainer = RLTrainer({"algorithm": "ppo", "env": "CartPole-v1"})
    result = trainer.train(steps=100_000)     # environment steps
    RLTrainer(resume="runs/CartPole-v1-ppo-20260101-120000").train()   # on to trainer.total_env_steps
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hybridflow.config import ConfigError
from hybridflow.config.env_schema import resolve_env_config
from hybridflow.config.tasks import TASK_KINDS
from hybridflow.config.schema import RunConfig
from hybridflow.controller import RayHold
from hybridflow.protocol import DataProto
from hybridflow.trainer.env.groups import build_env_groups, close_envs
from hybridflow.trainer.env.records import EnvDisplay, RecordAccumulator, crossed
from hybridflow.trainer.env.specs import collector_spec, env_program, learner_spec, network_spec
from hybridflow.trainer.env.state import load_env_state, save_env_state
from hybridflow.trainer.observe.loggers import RunLoggers, build_loggers
from hybridflow.trainer.observe.plots import plot_env_run
from hybridflow.trainer.programs.env_phases import EnvRun
from hybridflow.trainer.programs.phases import Roles, Step
from hybridflow.trainer.run.checkpointing import SavedRun, read_trainer_state, reopen_run_dir
from hybridflow.trainer.run.elastic import wait_for_lost_node
from hybridflow.trainer.run.lifecycle import ResumePoint, check_steps_left, job_resume_point
from hybridflow.trainer.run.run_dir import create_run_dir
from hybridflow.trainer.run.stop_signal import STOP
from hybridflow.trainer.task import TASK_PARTS, Task


@dataclass
class EnvTrainResult:
    run_dir: Path
    env_steps: int
    iterations: int
    wall_s: float  # training time of this train() call (set-up not included: setup_s)
    return_mean_window: float | None  # mean of the last trainer.return_window episodes (fewer early on)
    reached_target_at: int | None  # environment steps when trainer.target_return was reached
    last_metrics: dict[str, float]
    setup_s: float = 0.0  # Ray, the workers and their environments, when this call started them (RLTrainer.setup)


# Keys a resumed run may change: how long, how often, where it logs and how it runs on Ray.
RESUMABLE_KEYS = ("trainer.", "distributed.ray_address", "distributed.cpus_per_worker", "distributed.learner_cpus")


@dataclass
class EnvContext:
    """An environment run's directory, loggers and console, and its hold on Ray (None until
    a start with env runners needs it)."""

    cfg: RunConfig
    run_dir: Path
    log: RunLoggers
    display: EnvDisplay
    ray: RayHold | None = None

    @classmethod
    def open(cls, cfg: RunConfig, resume_from: Path | SavedRun | None = None,
             ray: RayHold | None = None) -> EnvContext:
        cfg = resolve_env_config(cfg)
        run_dir = reopen_run_dir(cfg, resume_from) if resume_from is not None else create_run_dir(cfg)
        display = EnvDisplay(cfg.trainer.display_mode())
        display.message(f"run directory: [bold]{run_dir}[/bold]")  # as LM runs: before anything can fail
        return cls(cfg, run_dir, build_loggers(cfg, run_dir, display), display, ray)

    def reopen(self, checkpoint: Path, cfg: RunConfig) -> EnvContext:
        """This run continuing from `checkpoint` (an automatic restart), on the same Ray hold."""
        self.close(keep_ray=True)
        return EnvContext.open(cfg, checkpoint, self.ray)

    def close(self, keep_ray: bool = False) -> None:
        self.display.stop()
        self.log.close()
        if self.ray is not None and not keep_ray:
            self.ray.close()
            self.ray = None


def warn_oversubscribed(num_workers: int, say: Any, cores: int | None = None) -> bool:
    """Say (at set-up) when there are more env runners than the cores this process may use
    (each runner is a process that imports torch: ~4 s to start and a few hundred MB; beyond
    one per core they take turns on the CPU, so collection gets no faster)."""
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    if num_workers <= cores:
        return False
    say(f"distributed.num_workers={num_workers} env runners on {cores} CPU core(s): beyond {cores} they take turns "
        f"on the cores, so collection is no faster, while each extra runner costs a process (~4 s to start, a few "
        f"hundred MB); set distributed.num_workers <= {cores} unless the cluster has more nodes")
    return True


class EnvironmentPart:
    """Environments on env runners, a learner; one iteration of the algorithm a step."""

    unit, phase = "iteration", "rl"

    def __init__(self) -> None:
        self.threads_before: int | None = None  # the process's torch threads before an in-process learner
        self.acc: RecordAccumulator | None = None
        self.horizon = 0
        self.reached: int | None = None

    def resume_point(self, resume: Any, config: RunConfig | None) -> ResumePoint:
        return job_resume_point(TASK_KINDS["environment"], "env", resume, config, RESUMABLE_KEYS)

    def open(self, cfg: RunConfig, resume_from: SavedRun | None) -> EnvContext:
        cfg = resolve_env_config(cfg)
        self.program = env_program(cfg)
        self.network = network_spec(cfg)  # probes one environment: its spaces (before the run dir exists)
        return EnvContext.open(cfg, resume_from)

    def restart_config(self, cfg: RunConfig, lost_node: str | None) -> RunConfig:
        """The same config: the runners are placed again on the nodes alive once the fate of
        `lost_node` (a dead rank's node) is settled (groups.py)."""
        if lost_node is not None:
            wait_for_lost_node(lost_node)
        return cfg

    # ------------------------------------------------------------------ set-up

    def start(self, task: Task) -> None:
        cfg, ctx = task.config, task.ctx
        dist = cfg.distributed
        if dist.ray_address is None:  # on this machine alone (a cluster's nodes bring their own cores)
            warn_oversubscribed(dist.num_workers, ctx.display.message)
        if dist.num_workers > 0:
            if ctx.ray is None:  # the runners and learner size themselves to the CPUs Ray has (groups.py)
                ctx.ray = RayHold(dist.ray_address, 1, key="distributed.num_workers")
            ctx.ray.use()
            STOP.install()  # after Ray's own SIGTERM handler, which ends the process with status 15
        elif self.threads_before is None:
            # In-process, the learner's CPUs are this process's torch threads. More threads
            # than free cores make OpenMP spin against other work (tens of times slower for
            # these small matmuls on a loaded machine), so the default is one.
            self.threads_before = torch.get_num_threads()
            torch.set_num_threads(max(1, int(dist.learner_cpus)))
        task.groups = build_env_groups(cfg, collector_spec(cfg, self.network, self.program),
                                       learner_spec(cfg, self.network, self.program))
        for group in task.groups.values():
            group.call_timeout_s = cfg.trainer.call_timeout_s
        task.roles = Roles(runners=task.groups["runners"], learner=task.groups["learner"])
        task.state = EnvRun(cfg, horizon=self.horizon)
        self.acc = RecordAccumulator(cfg.trainer.return_window)
        if task.resumed_from is None:
            task.state.send_weights_of(task.roles.learner)  # the runners act with the learner's initial weights

    def release(self, task: Task) -> None:
        """Close the environments; the process's torch threads (set for an in-process
        learner) are the caller's again."""
        if task.roles is not None:
            close_envs(task.roles.runners)
        if self.threads_before is not None:
            torch.set_num_threads(self.threads_before)
            self.threads_before = None

    # ------------------------------------------------------------------ the loop

    def steps_left(self, task: Task) -> int:
        """Checked before any worker starts, as in LM runs."""
        cfg = task.config
        return check_steps_left(self._env_steps_done(task), cfg.trainer.total_env_steps, "trainer.total_env_steps",
                                "environment step")

    def _env_steps_done(self, task: Task) -> int:
        """Environment steps consumed so far: the started run's, else those of the checkpoint it starts from."""
        if task.state is not None:
            return task.state.env_steps
        return int(read_trainer_state(task.resumed_from)["env_steps"]) if task.resumed_from is not None else 0

    def begin(self, task: Task, steps: int) -> int:
        target = task.state.env_steps + steps
        self.horizon = task.state.horizon = max(task.config.trainer.total_env_steps, target)
        self.started, self.reached = time.perf_counter(), None
        return target

    def progress(self, task: Task) -> int:
        return task.state.env_steps

    def show(self, task: Task, end: int) -> None:
        cfg = task.config
        task.ctx.display.start(f"{cfg.algorithm.name.upper()} {cfg.env.id}", end, task.state.env_steps)

    def step(self, task: Task) -> Step:
        step = Step(task.global_step, DataProto(), on_phase=task.status.phase)
        tick = time.perf_counter()
        self.program.program(step, task.roles, task.config, task.state)
        step.metrics["timing_s/iteration"] = time.perf_counter() - tick
        return step

    def record(self, task: Task, step: Step, before: int, end: int) -> dict[str, float] | None:
        """A record per trainer.log_freq environment steps (and at the end); stops at
        trainer.target_return, once a whole window of episodes reached it."""
        cfg, env_steps = task.config.trainer, task.state.env_steps
        self.acc.add(step.metrics)
        window = self.acc.window_mean(full=True)
        if cfg.target_return is not None and window is not None and window >= cfg.target_return:
            self.reached = env_steps
            task.stopped = f"return {window:.1f} >= target {cfg.target_return:g} after {env_steps:,} environment steps"
        if not (crossed(before, env_steps, cfg.log_freq) or env_steps >= end or self.reached):
            return None
        record = self.acc.flush(env_steps)
        task.ctx.display.record(record)
        return record

    def save_due(self, task: Task, before: int) -> bool:
        return crossed(before, task.state.env_steps, task.config.trainer.save_freq)

    # ------------------------------------------------------------------ checkpoints

    def save(self, task: Task, directory: Path) -> dict[str, Any]:
        run, roles = task.state, task.roles
        pending = run.sampler.drain()  # batches in flight belong to the next iterations
        roles.learner.save(str(directory / "learner"))
        save_env_state(directory, roles.runners.state_dict(), pending)
        return {"roles": ["learner", "runners"], **run.state_dict(), "records": self.acc.state_dict()}

    def load(self, task: Task, checkpoint: Path, state: dict[str, Any]) -> None:
        run, roles = task.state, task.roles
        roles.learner.load(str(checkpoint / "learner"))
        run.load_state_dict(state)
        run.send_weights_of(roles.learner)  # the uninterrupted run sends them with its next collection
        runner_states, pending, note = load_env_state(checkpoint)
        if len(runner_states) != roles.runners.world_size:
            raise ConfigError(f"the checkpoint holds {len(runner_states)} env runners, this run has "
                              f"{roles.runners.world_size}; resume with the same distributed.num_workers",
                              "distributed.num_workers")
        restored = roles.runners.load_state_dict(runner_states)
        if note is not None:
            task.ctx.display.message(note)
        elif not all(restored):
            task.ctx.display.message("environments could not be pickled: their episodes in progress restart")
        run.sampler.pending = deque(pending)
        self.acc.load_state_dict(state["records"])

    # ------------------------------------------------------------------ the end

    def finish(self, task: Task, record: dict[str, float]) -> EnvTrainResult:
        wall = time.perf_counter() - self.started
        if "jsonl" in task.config.trainer.loggers:
            plot_env_run(task.run_dir)
        task.ctx.display.message(f"run saved to [bold]{task.run_dir}[/bold]")
        return EnvTrainResult(task.run_dir, task.state.env_steps, task.global_step, wall, self.acc.window_mean(),
                              self.reached, record)


TASK_PARTS.add("environment", EnvironmentPart)
