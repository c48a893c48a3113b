"""Where a run's metrics go: one `RunLoggers` object fans each record out to the loggers
named in `trainer.loggers`.

    loggers = build_loggers(cfg, run_dir, display)     # RunContext.open does this
    loggers.write("rl", 3, {"score/mean": 0.4, ...})   # one call per record
    loggers.close()
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from hybridflow.config.compat import metric_renames
from hybridflow.config.schema import RunConfig
from hybridflow.trainer.observe.display import RunDisplay, eval_summary
# RL_PHASES: their keys share one step axis in TensorBoard / W&B, as in the plots
from hybridflow.trainer.observe.plots import RL_PHASES
from hybridflow.trainer.run.run_dir import MetricsLog


class MetricLogger(Protocol):
    """What every logger implements."""

    def write(self, phase: str, step: int, metrics: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


def scalar_tags(phase: str, metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a record under their dashboard tags: RL keys as they are,
    other phases' keys under "<phase>/" (their steps count something else)."""
    tags = {}
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        prefixed = phase in RL_PHASES or key.startswith(f"{phase}/")
        tags[key if prefixed else f"{phase}/{key}"] = float(value)
    return tags


class ConsoleLogger:
    """Prints evaluation records through the run's display (training steps are the
    display's progress bar or plain lines)."""

    def __init__(self, display: RunDisplay) -> None:
        self.display = display

    def write(self, phase: str, step: int, metrics: Mapping[str, Any]) -> None:
        if phase.endswith("eval") and "val/score" in metrics:  # a policy's held-out record (not an RM's)
            where = "SFT step" if phase.startswith("sft") else "step"
            self.display.message(f"{where} {step}: {eval_summary(metrics)}")

    def close(self) -> None:
        pass


class TensorBoardLogger:
    """Scalars into <run>/tensorboard (one event file per run)."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = log_dir
        self._writer = SummaryWriter(log_dir=str(log_dir))

    def write(self, phase: str, step: int, metrics: Mapping[str, Any]) -> None:
        for tag, value in scalar_tags(phase, metrics).items():
            self._writer.add_scalar(tag, value, global_step=step)
        self._writer.flush()  # a crashed run keeps every step it finished

    def close(self) -> None:
        self._writer.close()


class WandbLogger:
    """A Weights & Biases run named after the run directory, its files under <run>/wandb.
    The mode (online / offline / disabled) is W&B's own: WANDB_MODE is honoured."""

    def __init__(self, cfg: RunConfig, run_dir: Path) -> None:
        try:
            import wandb
        except ImportError as err:
            raise RuntimeError("trainer.loggers includes 'wandb' but the wandb package is not installed: "
                               "`pip install wandb`, or remove 'wandb' from trainer.loggers") from err
        from hybridflow.config import config_to_dict

        self._run = wandb.init(project=cfg.trainer.wandb_project, name=run_dir.name, dir=str(run_dir),
                               config=config_to_dict(cfg))

    def write(self, phase: str, step: int, metrics: Mapping[str, Any]) -> None:
        # W&B wants one increasing step per run, but SFT and RL steps each start at 0:
        # the record's own step travels as a value (pick it as the x-axis in the UI).
        tags = scalar_tags(phase, metrics)
        tags["rl/step" if phase in RL_PHASES else f"{phase}/step"] = float(step)
        self._run.log(tags)

    def close(self) -> None:
        self._run.finish()


class RunLoggers:
    """Every configured logger behind one `write` / `close`; `renames(step, metrics)` gives
    the same numbers under other names too (trainer.metric_names)."""

    def __init__(self, loggers: Mapping[str, MetricLogger],
                 renames: Callable[[int, Mapping[str, Any]], Mapping[str, Any]] | None = None) -> None:
        self.loggers = dict(loggers)
        self.renames = renames

    def write(self, phase: str, step: int, metrics: Mapping[str, Any]) -> None:
        if self.renames is not None:
            metrics = {**metrics, **self.renames(step, metrics)}
        for logger in self.loggers.values():
            logger.write(phase, step, metrics)

    def close(self) -> None:
        """Close all, the last opened first; one that fails is raised once all the others
        have flushed their files."""
        with contextlib.ExitStack() as stack:
            for logger in self.loggers.values():
                stack.callback(logger.close)


def build_loggers(cfg: RunConfig, run_dir: Path, display: RunDisplay) -> RunLoggers:
    """The loggers of `cfg.trainer.loggers`, in that order."""
    loggers: dict[str, MetricLogger] = {}
    try:
        for name in cfg.trainer.loggers:
            loggers[name] = _make(name, cfg, run_dir, display)
    except BaseException:
        RunLoggers(loggers).close()
        raise
    return RunLoggers(loggers, metric_renames(cfg.trainer.metric_names, cfg.trainer.validation.n))


def _make(name: str, cfg: RunConfig, run_dir: Path, display: RunDisplay) -> MetricLogger:
    if name == "console":
        return ConsoleLogger(display)
    if name == "jsonl":
        return MetricsLog(run_dir / "metrics.jsonl")
    if name == "tensorboard":
        return TensorBoardLogger(run_dir / "tensorboard")
    if name == "wandb":
        return WandbLogger(cfg, run_dir)
    raise ValueError(f"unknown logger {name!r} in trainer.loggers")
