"""The run directory: where a run's config, metrics, checkpoints and models go."""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

from hybridflow.config import ConfigError, save_config
from hybridflow.config.schema import RunConfig


def refuse_existing_run_dir(cfg: Any) -> None:
    """ConfigError when an explicit trainer.run_dir exists: a run never overwrites another."""
    path = cfg.trainer.run_dir
    if path is not None and Path(path).exists():
        # A start that failed outside `with RLTrainer(...)`, or was killed, leaves its directory until close().
        unused = (f" It holds only what a start writes (no step ran): remove it (rm -r {path}) to start there "
                  "again, or pick") if is_unused_run_dir(Path(path)) else " Pick"
        raise ConfigError(f"{path!r} already exists; a run never overwrites another.{unused} a new "
                          "directory, or leave trainer.run_dir null for <output_dir>/<name>-<timestamp>",
                          "trainer.run_dir")


def create_run_dir(cfg: RunConfig) -> Path:
    """Make the run's directory (never one that exists) and save the resolved config in it."""
    refuse_existing_run_dir(cfg)
    if cfg.trainer.run_dir is not None:
        path = Path(cfg.trainer.run_dir)
        path.mkdir(parents=True)
    else:
        root = Path(cfg.trainer.output_dir)
        root.mkdir(parents=True, exist_ok=True)
        stem = f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        for suffix in range(1000):
            path = root / (stem if suffix == 0 else f"{stem}-{suffix}")
            with contextlib.suppress(FileExistsError):
                path.mkdir()  # atomic: two runs started in the same second get different dirs
                break
        else:
            raise RuntimeError(f"could not create a fresh run directory under {root}")
    save_config(cfg, path / "config.yaml")
    return path


# What a run directory holds before its first step; a start that fails with only these
# there removes the directory (nothing of value is in it).
_START_FILES = {"config.yaml", "model", "metrics.jsonl", "tensorboard", "status.json", "timeline.jsonl"}
_EMPTY_AT_START = ("metrics.jsonl", "timeline.jsonl")  # a line in either: something ran


def discard_unused_run_dir(path: Path) -> bool:
    """Remove a new run directory whose start failed, if it holds only what a start writes
    (config, built-in model, an empty metrics.jsonl and timeline, the live status,
    TensorBoard files): a failed start leaves no empty run directory behind. Anything more
    (a logged step, a checkpoint) keeps it. Returns whether it was removed."""
    if not is_unused_run_dir(Path(path)):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


def is_unused_run_dir(path: Path) -> bool:
    """Whether `path` is a run directory holding only what a start writes (discard_unused_run_dir)."""
    if not path.is_dir():
        return False
    names = {entry.name for entry in path.iterdir()}
    ran = any((path / n).is_file() and (path / n).stat().st_size > 0 for n in _EMPTY_AT_START)
    return names <= _START_FILES and not ran


class MetricsLog:
    """The "jsonl" logger (observe/loggers.py): appends one JSON line per record to
    <run>/metrics.jsonl (flushed at once, so a crashed run keeps every step it finished).
    Non-finite numbers are written as null."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = path.open("a", encoding="utf-8")

    def write(self, phase: str, step: int, metrics: dict[str, Any]) -> None:
        record = {"phase": phase, "step": step, "time": round(time.time(), 3)}
        record.update({k: None if isinstance(v, float) and not math.isfinite(v) else v
                       for k, v in sorted(metrics.items())})
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file. A last line cut short (the process was killed
    while writing it) is left out; a bad line anywhere else is a ValueError naming it."""
    return [record for _, record in metrics_lines(Path(path).read_text(encoding="utf-8"), str(path))]


def metrics_lines(text: str, where: str) -> list[tuple[str, dict[str, Any]]]:
    """(line, record) of each complete record in the text of a metrics.jsonl file (see read_metrics)."""
    lines = [line for line in text.splitlines(keepends=True) if line.strip()]
    out = []
    for number, line in enumerate(lines, start=1):
        try:
            out.append((line, json.loads(line)))
        except json.JSONDecodeError as err:
            if number == len(lines) and not line.endswith("\n"):
                break  # torn by a crash mid-write: the step it describes is done again on resume
            raise ValueError(f"{where}: line {number} is not valid JSON ({err}); the file was edited or "
                             "damaged: fix or remove that line") from None
    return out
