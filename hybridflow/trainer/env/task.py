"""`EnvironmentTask`: what `RLTrainer` runs for an environment task (a registered environment
algorithm, PPO or SAC, on an environment), with the run directory, loggers, plots and
checkpoints of language-model runs.

    trainer = RLTrainer({"algorithm": "ppo", "env": "CartPole-v1"})    # entry.py builds an EnvironmentTask
    result = trainer.train(steps=100_000)     # environment steps
    RLTrainer(resume="runs/CartPole-v1-ppo-20260101-120000").train()   # on to trainer.total_env_steps

`train` runs iterations of the algorithm's program (programs.py) until `steps` more
environment steps were consumed (the last iteration may pass the mark), or until the
rolling mean return reaches trainer.target_return; a SIGTERM or SIGINT (run/stop_signal.py)
lets the iteration in progress finish, checkpoints it (trainer.save_on_signal) and raises
RunTerminated, the workers are shut down on the way out. Records: records.py. Checkpoints
(every trainer.save_freq environment steps) hold the learner ranks' states, every runner's
environments and RNG, batches still in flight (async sampling) and the controller's
counters, so a resumed run continues exactly as the uninterrupted one would have
(environments that cannot be pickled, such as MuJoCo ones, restart their episodes).
"""

from __future__ import annotations

import copy
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hybridflow.config import ConfigError
from hybridflow.config.env_schema import EnvRunConfig, env_config_from_dict, resolve_env_config
from hybridflow.config.tasks import TASK_KINDS
from hybridflow.controller import RayHold
from hybridflow.trainer.env.groups import EnvGroups, build_env_groups
from hybridflow.trainer.env.programs import EnvRun
from hybridflow.trainer.env.records import EnvDisplay, RecordAccumulator, crossed
from hybridflow.trainer.env.specs import collector_spec, env_program, learner_spec, network_spec
from hybridflow.trainer.env.state import load_env_state, save_env_state
from hybridflow.trainer.observe.loggers import build_loggers
from hybridflow.trainer.observe.plots import plot_env_run
from hybridflow.trainer.run.checkpointing import (
    SavedRun,
    begin_checkpoint,
    commit_checkpoint,
    controller_rng_state,
    read_trainer_state,
    reopen_run_dir,
    saved_run,
    set_controller_rng_state,
)
from hybridflow.trainer.run.lifecycle import check_steps_left, checkpoint_of_runs, unchanged_but
from hybridflow.trainer.run.run_dir import create_run_dir, discard_unused_run_dir
from hybridflow.trainer.run.stop_signal import STOP, RunTerminated, stopped_line


@dataclass
class EnvTrainResult:
    run_dir: Path
    env_steps: int
    iterations: int
    wall_s: float  # training time of this train() call (set-up not included: setup_s)
    return_mean_window: float | None  # mean of the last trainer.return_window episodes (fewer early on)
    reached_target_at: int | None  # environment steps when trainer.target_return was reached
    last_metrics: dict[str, float]
    setup_s: float = 0.0  # Ray, the workers and their environments, when this call started them (EnvironmentTask.setup)


def warn_oversubscribed(num_workers: int, say: Any, cores: int | None = None) -> bool:
    """Say (once per trainer: at set-up) when there are more env runners than the cores this
    process may use (each runner is a process that imports torch: ~4 s to start and a few
    hundred MB; beyond one per core they take turns on the CPU, so collection gets no faster)."""
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    if num_workers <= cores:
        return False
    say(f"distributed.num_workers={num_workers} env runners on {cores} CPU core(s): beyond {cores} they take turns "
        f"on the cores, so collection is no faster, while each extra runner costs a process (~4 s to start, a few "
        f"hundred MB); set distributed.num_workers <= {cores} unless the cluster has more nodes")
    return True


class EnvironmentTask:
    """Creates (or reopens) the run directory at construction; starts workers on `train`."""

    def __init__(self, config: EnvRunConfig | None = None, resume: str | Path | SavedRun | None = None) -> None:
        self.checkpoint: Path | None = None
        if resume is True:  # `--resume` without PATH: the newest checkpoint of the config's runs (as LM runs)
            resume = checkpoint_of_runs(resolve_env_config(config))
        run = None
        if resume is not None:
            run = saved_run(resume)  # the run's config.yaml, read once
            self.checkpoint = run.checkpoint
            config = resume_config(run, config)
        cfg = resolve_env_config(config)
        self.config = cfg
        self.program = env_program(cfg)
        self.network = network_spec(cfg)
        self.run_dir = reopen_run_dir(cfg, run) if run is not None else create_run_dir(cfg)
        self.display = EnvDisplay(cfg.trainer.display_mode())
        self.display.message(f"run directory: [bold]{self.run_dir}[/bold]")  # as LM runs: before anything can fail
        self.log = build_loggers(cfg, self.run_dir, self.display)
        self.iteration = int(read_trainer_state(self.checkpoint)["global_step"]) if self.checkpoint else 0
        self.acc = RecordAccumulator(cfg.trainer.return_window)
        self.groups: EnvGroups | None = None
        self.run: EnvRun | None = None
        self.saved_checkpoint: Path | None = self.checkpoint  # the newest checkpoint this task wrote or read
        self.saved_iteration: int | None = self.iteration if self.checkpoint else None
        if self.checkpoint is not None:
            self.display.message(f"resuming from {self.checkpoint} (iteration {self.iteration})")
        self._ray: RayHold | None = None  # with distributed.num_workers >= 1
        self._threads_before: int | None = None
        STOP.install()  # a SIGTERM while starting abandons the start (installed again once Ray is up)

    def release(self, save: bool) -> None:
        """Stop the workers and release their placement groups (Ray stays up, though a later
        trainer needing more CPUs may restart it: controller RayHold); with `save`,
        checkpoint the run first, so that the next `train` continues exactly from here. The
        process's torch threads (set for an in-process learner) are the caller's again."""
        if self.groups is not None:
            if save and self.saved_iteration != self.iteration:
                self.save_checkpoint()
            self.checkpoint = self.saved_checkpoint  # where the next start continues (None: from scratch)
            self.groups.shutdown()
            self.groups, self.run = None, None
            if self._ray is not None:
                self._ray.idle()
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None

    def close(self) -> None:
        """Stop the workers (and Ray, when this trainer started it); close the loggers."""
        self.release(save=False)
        self.log.close()
        if self.saved_checkpoint is None and self.iteration == 0:  # a failed start leaves no run dir (as LM runs)
            discard_unused_run_dir(self.run_dir)
        if self._ray is not None:
            self._ray.close()
            self._ray = None

    def setup(self) -> float:
        """Start Ray (if needed), the env runners and the learner (RLTrainer.setup)."""
        if self.run is not None:
            return 0.0
        tick = time.perf_counter()
        self._start()
        return time.perf_counter() - tick

    def _start(self) -> None:
        cfg = self.config
        if cfg.distributed.ray_address is None:  # on this machine alone (a cluster's nodes bring their own cores)
            warn_oversubscribed(cfg.distributed.num_workers, self.display.message)
        if cfg.distributed.num_workers > 0:
            if self._ray is None:  # the runners and learner size themselves to the CPUs Ray has (groups.py)
                self._ray = RayHold(cfg.distributed.ray_address, 1, key="distributed.num_workers")
            self._ray.use()
            STOP.install()  # after Ray's own SIGTERM handler, which ends the process with status 15
        elif self._threads_before is None:
            # In-process, the learner's CPUs are this process's torch threads. More threads
            # than free cores make OpenMP spin against other work (tens of times slower for
            # these small matmuls on a loaded machine), so the default is one.
            self._threads_before = torch.get_num_threads()
            torch.set_num_threads(max(1, int(cfg.distributed.learner_cpus)))
        self.groups = build_env_groups(cfg, collector_spec(cfg, self.network, self.program),
                                       learner_spec(cfg, self.network, self.program))
        self.run = EnvRun(cfg, self.groups)
        self.run.start_sampler(self.program.submit(self.run))
        if self.checkpoint is not None:
            self._load_checkpoint(self.checkpoint)
        else:
            self.iteration, self.acc = 0, RecordAccumulator(cfg.trainer.return_window)  # a restart from scratch
            self.run.sync_weights()  # the runners act with the learner's initial weights

    # ------------------------------------------------------------------ loop

    def train(self, steps: int | float | None = None) -> EnvTrainResult:
        """Run `steps` more environment steps (default: on to trainer.total_env_steps)."""
        cfg = self.config
        if steps is None:  # checked before any worker starts, as in LM runs
            steps = check_steps_left(self._env_steps_done(), cfg.trainer.total_env_steps, "trainer.total_env_steps",
                                     "environment step")
        setup_s = self.setup()
        run = self.run
        target = run.env_steps + steps
        run.horizon = max(cfg.trainer.total_env_steps, target)
        iteration_fn = self.program.iteration
        self.display.start(f"{cfg.algorithm.upper()} {cfg.env.id}", target, run.env_steps)
        started, reached, record = time.perf_counter(), None, {}
        with STOP.deferred():  # a signal lets the iteration in progress finish (run/stop_signal.py)
            while run.env_steps < target and reached is None:
                self.iteration += 1
                before, tick = run.env_steps, time.perf_counter()
                metrics = iteration_fn(run)
                metrics["timing_s/iteration"] = time.perf_counter() - tick
                self.acc.add(metrics)
                window = self.acc.window_mean(full=True)  # a target needs a whole window of episodes
                if cfg.trainer.target_return is not None and window is not None and window >= cfg.trainer.target_return:
                    reached = run.env_steps
                if crossed(before, run.env_steps, cfg.trainer.log_freq) or run.env_steps >= target or reached:
                    record = self.acc.flush(run.env_steps)
                    self.log.write("rl", self.iteration, record)
                    self.display.record(record)
                if crossed(before, run.env_steps, cfg.trainer.save_freq):  # after the record: its steps are logged
                    self.save_checkpoint()
                if STOP.received:
                    self.display.stop()
                    raise RunTerminated(stopped_line(self.iteration, self._checkpoint_on_signal(), self.run_dir,
                                                     "iteration"))
        self.display.stop()
        wall = time.perf_counter() - started
        if "jsonl" in cfg.trainer.loggers:
            plot_env_run(self.run_dir)
        if reached is not None:
            self.display.message(f"return {self.acc.window_mean():.1f} >= target {cfg.trainer.target_return:g} "
                                 f"after {reached:,} environment steps")
        self.display.message(f"run saved to [bold]{self.run_dir}[/bold]")
        return EnvTrainResult(self.run_dir, run.env_steps, self.iteration, wall, self.acc.window_mean(), reached,
                              record, setup_s)

    def _env_steps_done(self) -> int:
        """Environment steps consumed so far: the started run's, else those of the checkpoint it starts from."""
        if self.run is not None:
            return self.run.env_steps
        return int(read_trainer_state(self.checkpoint)["env_steps"]) if self.checkpoint is not None else 0

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self) -> Path:
        """Checkpoint the run after the current iteration into <run>/checkpoints/global_step_<iteration>."""
        run = self.run
        pending = run.sampler.drain()  # batches in flight belong to the next iterations
        tmp = begin_checkpoint(self.run_dir, self.iteration)
        self.groups.learner.save(str(tmp / "learner"))
        save_env_state(tmp, self.groups.runners.state_dict(), pending)
        state = {"kind": CHECKPOINT_KIND, "global_step": self.iteration,
                 "roles": ["learner", "runners"], "env_steps": run.env_steps, "submitted_steps": run.submitted_steps,
                 "policy_version": run.version, "records": self.acc.state_dict(), "rng": controller_rng_state()}
        self.saved_checkpoint = commit_checkpoint(tmp, state, self.config.trainer.keep_last_checkpoints)
        self.saved_iteration = self.iteration
        return self.saved_checkpoint

    def _checkpoint_on_signal(self) -> Path | None:
        """The checkpoint a run stopped by a signal leaves: this iteration's (written now with
        trainer.save_on_signal, unless save_freq just wrote it), else the newest there is
        (the accumulated records not yet logged are in it: a resumed run logs them)."""
        if self.config.trainer.save_on_signal and self.saved_iteration != self.iteration:
            return self.save_checkpoint()
        return self.saved_checkpoint

    def _load_checkpoint(self, checkpoint: Path) -> None:
        state = read_trainer_state(checkpoint)
        if state.get("kind") != CHECKPOINT_KIND:
            raise ValueError(f"{str(checkpoint)!r} is not a checkpoint of an environment run")
        run = self.run
        self.groups.learner.load(str(checkpoint / "learner"))
        run.version, run.env_steps = int(state["policy_version"]), int(state["env_steps"])
        run.submitted_steps = int(state["submitted_steps"])
        self.iteration = int(state["global_step"])
        run.sync_weights()  # the learner's weights: the uninterrupted run sends them with its next collection
        runner_states, pending, note = load_env_state(checkpoint)
        if len(runner_states) != self.groups.runners.world_size:
            raise ConfigError(f"the checkpoint holds {len(runner_states)} env runners, this run has "
                              f"{self.groups.runners.world_size}; resume with the same distributed.num_workers",
                              "distributed.num_workers")
        restored = self.groups.runners.load_state_dict(runner_states)
        if note is not None:
            self.display.message(note)
        elif not all(restored):
            self.display.message("environments could not be pickled: their episodes in progress restart")
        run.sampler.pending = deque(pending)
        self.acc.load_state_dict(state["records"])
        set_controller_rng_state(state["rng"])


CHECKPOINT_KIND = TASK_KINDS["environment"].checkpoint_kind  # trainer_state.json's "kind" (config/tasks.py)
# Keys a resumed run may change: how long, how often, where it logs and how it runs on Ray.
RESUMABLE_KEYS = ("trainer.", "distributed.ray_address", "distributed.cpus_per_worker", "distributed.learner_cpus")


def resume_config(run: SavedRun, config: EnvRunConfig | None) -> EnvRunConfig:
    """The saved config of the checkpoint's run, or `config` if it changes only RESUMABLE_KEYS."""
    saved = env_config_from_dict(copy.deepcopy(run.tree))
    if config is None:
        return saved
    return unchanged_but(run.checkpoint, saved, resolve_env_config(config), RESUMABLE_KEYS,
                         f"drop these overrides (a resumed run may change {', '.join(RESUMABLE_KEYS)})")
