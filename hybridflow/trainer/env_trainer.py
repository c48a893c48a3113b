"""`EnvTrainer`: PPO or SAC on an environment, with the run directory, loggers, plots and
checkpoints of language-model runs.

    trainer = EnvTrainer({"algorithm": "ppo", "env": "CartPole-v1"})   # a dict, EnvRunConfig or YAML path
    result = trainer.train(steps=100_000)     # environment steps (an int or an integral float)
    trainer.close()
    EnvTrainer(resume="runs/CartPole-v1-ppo-20260101-120000").train()  # on to trainer.total_env_steps

`train` runs iterations of the algorithm's program (env_programs.py) until `steps` more
environment steps were consumed (the last iteration may pass the mark), or until the
rolling mean return reaches trainer.target_return. Records: env_records.py. Checkpoints
(every trainer.save_freq environment steps) hold the learner ranks' states, every runner's
environments and RNG, batches still in flight (async sampling) and the controller's
counters, so a resumed run continues exactly as the uninterrupted one would have
(environments that cannot be pickled, such as MuJoCo ones, restart their episodes).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridflow.config import ConfigError, config_to_dict
from hybridflow.config.env_schema import EnvRunConfig, env_config_from_dict, load_env_config, resolve_env_config
from hybridflow.trainer.env_groups import EnvGroups, build_env_groups
from hybridflow.trainer.env_programs import PROGRAMS, EnvRun
from hybridflow.trainer.env_records import EnvDisplay, RecordAccumulator, crossed
from hybridflow.trainer.env_specs import collector_spec, learner_spec, network_spec


@dataclass
class EnvTrainResult:
    run_dir: Path
    env_steps: int
    iterations: int
    wall_s: float  # of this train() call
    return_mean_window: float | None
    reached_target_at: int | None  # environment steps when trainer.target_return was reached
    last_metrics: dict[str, float]


def coerce_env_config(config: EnvRunConfig | dict | str | Path) -> EnvRunConfig:
    if isinstance(config, EnvRunConfig):
        return resolve_env_config(config)
    if isinstance(config, dict):
        return env_config_from_dict(config)
    if isinstance(config, (str, Path)):
        return load_env_config(config)
    raise TypeError(f"an environment config is a dict, an EnvRunConfig or a YAML path, got {type(config).__name__}")


def as_env_steps(steps: Any) -> int:
    """`steps` as a positive int; integral floats such as 1e6 are accepted."""
    if isinstance(steps, bool) or not isinstance(steps, (int, float)):
        raise TypeError(f"steps must be a number of environment steps (int, or an integral float like 1e6), "
                        f"got {steps!r}")
    if isinstance(steps, float) and not steps.is_integer():
        raise ValueError(f"steps must be a whole number of environment steps, got {steps}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    return int(steps)


class EnvTrainer:
    """Creates (or reopens) the run directory at construction; starts workers on `train`."""

    def __init__(self, config: EnvRunConfig | dict | str | Path | None = None, resume: str | Path | None = None) -> None:
        from hybridflow.trainer.checkpointing import find_checkpoint, read_trainer_state, reopen_run_dir
        from hybridflow.trainer.loggers import build_loggers
        from hybridflow.trainer.run_dir import create_run_dir

        self.checkpoint: Path | None = None
        if resume is not None:
            self.checkpoint = find_checkpoint(resume)
            config = resume_config(self.checkpoint, config)
        elif config is None:
            raise TypeError("EnvTrainer needs a config (dict, EnvRunConfig or YAML path) or resume=<run dir>")
        cfg = coerce_env_config(config)
        self.config = cfg
        self.network = network_spec(cfg)
        self.run_dir = reopen_run_dir(cfg, self.checkpoint) if self.checkpoint else create_run_dir(cfg)
        self.display = EnvDisplay(cfg.trainer.console)
        from hybridflow.trainer.display import RunDisplay

        self.log = build_loggers(cfg, self.run_dir, RunDisplay(cfg.trainer.console))
        self.iteration = int(read_trainer_state(self.checkpoint)["global_step"]) if self.checkpoint else 0
        self.acc = RecordAccumulator(cfg.trainer.return_window)
        self.groups: EnvGroups | None = None
        self.run: EnvRun | None = None
        self._ray_started = False
        self._threads_before: int | None = None

    def __enter__(self) -> EnvTrainer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def env_steps(self) -> int:
        return self.run.env_steps if self.run is not None else 0

    def close(self) -> None:
        """Stop the workers (and Ray, when this trainer started it); close the loggers."""
        if self.groups is not None:
            self.groups.shutdown()
            self.groups, self.run = None, None
        self.log.close()
        if self._threads_before is not None:
            import torch

            torch.set_num_threads(self._threads_before)
            self._threads_before = None
        if self._ray_started:
            import ray

            ray.shutdown()
            self._ray_started = False

    def _start(self) -> None:
        cfg = self.config
        if cfg.distributed.num_workers > 0:
            import ray

            self._ray_started = not ray.is_initialized()
        else:
            import torch

            # In-process, the learner's CPUs are this process's torch threads. More threads
            # than free cores make OpenMP spin against other work (tens of times slower for
            # these small matmuls on a loaded machine), so the default is one.
            self._threads_before = torch.get_num_threads()
            torch.set_num_threads(max(1, int(cfg.distributed.learner_cpus)))
        self.groups = build_env_groups(cfg, collector_spec(cfg, self.network), learner_spec(cfg, self.network))
        self.run = EnvRun(cfg, self.groups)
        self.run.start_sampler(PROGRAMS[cfg.algorithm][0](self.run))
        if self.checkpoint is not None:
            self._load_checkpoint(self.checkpoint)
        else:
            self.run.sync_weights()  # the runners act with the learner's initial weights

    # ------------------------------------------------------------------ loop

    def train(self, steps: int | float | None = None) -> EnvTrainResult:
        """Run `steps` more environment steps (default: on to trainer.total_env_steps)."""
        cfg = self.config
        if self.run is None:
            self._start()
        run = self.run
        if steps is None:
            steps = cfg.trainer.total_env_steps - run.env_steps
            if steps < 1:
                raise ConfigError(f"nothing to train: the run is at {run.env_steps} environment steps and "
                                  f"trainer.total_env_steps={cfg.trainer.total_env_steps}; raise it or pass steps",
                                  "trainer.total_env_steps")
        target = run.env_steps + as_env_steps(steps)
        run.horizon = max(cfg.trainer.total_env_steps, target)
        iteration_fn = PROGRAMS[cfg.algorithm][1]
        self.display.start(f"{cfg.algorithm.upper()} {cfg.env.id}", target, run.env_steps)
        started, reached, record = time.perf_counter(), None, {}
        while run.env_steps < target and reached is None:
            self.iteration += 1
            before, tick = run.env_steps, time.perf_counter()
            metrics = iteration_fn(run)
            metrics["timing_s/iteration"] = time.perf_counter() - tick
            self.acc.add(metrics)
            window = self.acc.window_mean()
            if cfg.trainer.target_return is not None and window is not None and window >= cfg.trainer.target_return:
                reached = run.env_steps
            if crossed(before, run.env_steps, cfg.trainer.log_freq) or run.env_steps >= target or reached:
                record = self.acc.flush(run.env_steps)
                self.log.write("rl", self.iteration, record)
                self.display.record(record)
            if crossed(before, run.env_steps, cfg.trainer.save_freq):  # after the record: its steps are logged
                self.save_checkpoint()
        self.display.stop()
        wall = time.perf_counter() - started
        if "jsonl" in cfg.trainer.loggers:
            from hybridflow.trainer.env_plots import plot_env_run

            plot_env_run(self.run_dir)
        if reached is not None:
            self.display.message(f"return {self.acc.window_mean():.1f} >= target {cfg.trainer.target_return:g} "
                                 f"after {reached:,} environment steps")
        self.display.message(f"run saved to [bold]{self.run_dir}[/bold]")
        return EnvTrainResult(self.run_dir, run.env_steps, self.iteration, wall, self.acc.window_mean(), reached, record)

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self) -> Path:
        """Checkpoint the run after the current iteration into <run>/checkpoints/global_step_<iteration>."""
        from hybridflow.trainer.checkpointing import (
            STATE_VERSION,
            begin_checkpoint,
            commit_checkpoint,
            controller_rng_state,
        )
        from hybridflow.trainer.env_state import save_env_state

        run = self.run
        pending = run.sampler.drain()  # batches in flight belong to the next iterations
        tmp = begin_checkpoint(self.run_dir, self.iteration)
        self.groups.learner.save(str(tmp / "learner"))
        save_env_state(tmp, self.groups.runners.state_dict(), pending)
        state = {"version": STATE_VERSION, "kind": "env", "global_step": self.iteration, "roles": ["learner", "runners"],
                 "env_steps": run.env_steps, "submitted_steps": run.submitted_steps, "policy_version": run.version,
                 "records": self.acc.state_dict(), "rng": controller_rng_state()}
        return commit_checkpoint(tmp, state, self.config.trainer.keep_last_checkpoints)

    def _load_checkpoint(self, checkpoint: Path) -> None:
        from collections import deque

        from hybridflow.trainer.checkpointing import read_trainer_state, set_controller_rng_state
        from hybridflow.trainer.env_state import load_env_state

        state = read_trainer_state(checkpoint)
        if state.get("kind") != "env":
            raise ValueError(f"{str(checkpoint)!r} is not a checkpoint of an environment run")
        run = self.run
        self.groups.learner.load(str(checkpoint / "learner"))
        run.version, run.env_steps = int(state["policy_version"]), int(state["env_steps"])
        run.submitted_steps = int(state["submitted_steps"])
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


# Keys a resumed run may change: how long, how often, where it logs and how it runs on Ray.
RESUMABLE_KEYS = ("trainer.", "distributed.ray_address", "distributed.cpus_per_worker", "distributed.learner_cpus")


def resume_config(checkpoint: Path, config: EnvRunConfig | dict | str | Path | None) -> EnvRunConfig:
    """The saved config of the checkpoint's run, or `config` if it changes only RESUMABLE_KEYS."""
    from hybridflow.trainer.checkpointing import run_config_path

    saved = load_env_config(run_config_path(checkpoint))
    if config is None:
        return saved
    cfg = coerce_env_config(config)
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, run_dir=saved.trainer.run_dir,
                                                               output_dir=saved.trainer.output_dir))
    changed = sorted(k for k in changed_keys(config_to_dict(saved), config_to_dict(cfg)) if not k.startswith(RESUMABLE_KEYS))
    if changed:
        raise ConfigError(f"cannot resume {str(checkpoint)!r} with a different {', '.join(changed)}: a checkpoint "
                          f"only means something with the config that wrote it (a resumed run may change "
                          f"{', '.join(RESUMABLE_KEYS)})")
    return cfg


def changed_keys(before: Any, after: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two config trees."""
    if isinstance(before, dict) and isinstance(after, dict):
        return [key for name in before.keys() | after.keys()
                for key in changed_keys(before.get(name), after.get(name), f"{prefix}{name}.")]
    return [] if before == after else [prefix.rstrip(".")]
