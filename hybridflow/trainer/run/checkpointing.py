"""Run-level checkpoints of the RL loop: where they live, how to find, write and read them,
and how a run directory is reopened to continue after one (which checkpoint a run resumes,
with which config, is decided in run/lifecycle.py).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from hybridflow.config import config_to_dict, save_config
from hybridflow.config.loader import user_tree
from hybridflow.config.schema import RunConfig
from hybridflow.errors import DamagedFileError, UserInputError
from hybridflow.engines.train.checkpoint import (
    TMP_PREFIX,
    begin_atomic_dir,
    prune_atomic_dirs,
    publish_atomic_dir,
    write_text_atomically,
    writing_checkpoint,
)
from hybridflow.trainer.run.run_dir import metrics_lines, read_metrics
from hybridflow.trainer.run.verify import verify_checkpoint

logger = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
TRAINER_STATE_FILE = "trainer_state.json"
STEP_PREFIX = "global_step_"
STATE_VERSION = 1  # of trainer_state.json
_STEP_DIR = re.compile(rf"^{STEP_PREFIX}(\d+)$")


class CheckpointNotFoundError(FileNotFoundError, UserInputError):
    """No complete checkpoint where one was asked for; the message says what was looked at."""


class CheckpointDamagedError(DamagedFileError):
    """A checkpoint's files are missing, cut short or unreadable; the message names them."""


FILES_KEY = "files"  # trainer_state.json: relative path -> size of every file of the checkpoint


def checkpoint_files(checkpoint_dir: Path) -> dict[str, int]:
    """Every file under `checkpoint_dir` (but the trainer state) with its size in bytes."""
    return {str(p.relative_to(checkpoint_dir)): p.stat().st_size for p in sorted(checkpoint_dir.rglob("*"))
            if p.is_file() and p.name != TRAINER_STATE_FILE}


def damaged_files(checkpoint_dir: str | Path) -> list[str]:
    """Files the checkpoint recorded that are now missing or of another size (a deleted or
    truncated shard). Checkpoints written before files were recorded count as intact."""
    path = Path(checkpoint_dir)
    recorded = read_trainer_state(path).get(FILES_KEY)
    if not recorded:
        return []
    if not isinstance(recorded, dict) or not all(isinstance(size, int) for size in recorded.values()):
        raise CheckpointDamagedError(f"{str(path / TRAINER_STATE_FILE)!r} records its files in a form hybridflow "
                                     "does not write: this checkpoint is damaged")
    now = checkpoint_files(path)
    return [f"{name} ({'missing' if name not in now else f'{now[name]} of {size} bytes'})"
            for name, size in recorded.items() if now.get(name) != size]


def checkpoint_step(checkpoint_dir: str | Path) -> int:
    """N of a `global_step_<N>` directory."""
    match = _STEP_DIR.match(Path(checkpoint_dir).name)
    if match is None:
        raise CheckpointNotFoundError(f"{str(checkpoint_dir)!r} is not a checkpoint directory (global_step_<N>)")
    return int(match.group(1))


def is_complete(checkpoint_dir: str | Path) -> bool:
    """A `global_step_<N>` directory that the rename made visible (it has the trainer state,
    which is written last)."""
    path = Path(checkpoint_dir)
    return _STEP_DIR.match(path.name) is not None and (path / TRAINER_STATE_FILE).is_file()


def complete_checkpoints(root: str | Path) -> list[Path]:
    """The complete checkpoints under a `checkpoints/` root, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and is_complete(p)]
    return sorted(found, key=checkpoint_step)


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint directory `path` stands for.

    - a run directory (`<run>`, holding `checkpoints/`) -> its newest complete checkpoint;
    - a `checkpoints/` root -> its newest complete checkpoint;
    - a checkpoint directory (`.../global_step_<N>`) -> itself, if complete.

    Raises CheckpointNotFoundError (a FileNotFoundError) saying what was found instead. Every
    file of the checkpoint returned was read as its loader will (run/verify.py): a planted
    payload or a damaged file is refused here, on the controller, before any worker starts.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointNotFoundError(f"{str(path)!r} does not exist; pass a run directory or a "
                                      f"{CHECKPOINTS_DIR}/{STEP_PREFIX}<N> directory")
    if path.name.startswith(TMP_PREFIX):
        raise CheckpointNotFoundError(
            f"{str(path)!r} is an unfinished checkpoint (its save was interrupted) and cannot be loaded; "
            "pass the run directory to use its newest complete checkpoint")
    if _STEP_DIR.match(path.name):
        if not is_complete(path):
            raise CheckpointNotFoundError(
                f"{str(path)!r} is not a complete checkpoint (no {TRAINER_STATE_FILE}); it was not fully "
                f"written. Pass its run directory to use the newest complete checkpoint instead")
        damaged = damaged_files(path)
        if damaged:
            raise CheckpointDamagedError(
                f"checkpoint {str(path)!r} is damaged: {', '.join(damaged[:3])}. Pass its run directory to "
                "use the newest intact checkpoint instead")
        verify_checkpoint(path)
        return path
    root = path / CHECKPOINTS_DIR if (path / CHECKPOINTS_DIR).is_dir() else path
    found = complete_checkpoints(root)
    if not found:
        raise CheckpointNotFoundError(
            f"no complete checkpoint under {str(root)!r}; a run writes {CHECKPOINTS_DIR}/{STEP_PREFIX}<N> "
            "every trainer.save_freq steps (save_freq=0 writes none)")
    for checkpoint in reversed(found):
        damaged = damaged_files(checkpoint)
        if not damaged:
            verify_checkpoint(checkpoint)
            return checkpoint
        logger.warning("checkpoint %s is damaged (%s); using the one before it", checkpoint, ", ".join(damaged[:3]))
    raise CheckpointDamagedError(f"every checkpoint under {str(root)!r} is damaged (files missing or cut short); "
                                 "start a new run, or from an exported model (model.path)")


def role_checkpoint_path(checkpoint_dir: str | Path, role: str) -> Path:
    """The engine checkpoint of `role` ("actor", "critic") inside a run checkpoint."""
    path = Path(checkpoint_dir) / role
    if not (path / ".metadata").is_file():
        raise CheckpointNotFoundError(f"checkpoint {str(checkpoint_dir)!r} has no {role} engine checkpoint "
                                      f"({str(path)!r} with .metadata)")
    return path


def actor_checkpoint_path(checkpoint_dir: str | Path) -> str:
    """What `ActorRolloutRefWorker.load_checkpoint` takes to restore the actor of a run
    checkpoint (`checkpoint_dir` as returned by `find_checkpoint`)."""
    return str(role_checkpoint_path(checkpoint_dir, "actor"))


def run_dir_of(checkpoint_dir: str | Path) -> Path:
    """The run directory a checkpoint belongs to (`<run>/checkpoints/global_step_<N>`)."""
    path = Path(checkpoint_dir).resolve()
    checkpoint_step(path)  # raises for anything that is not a checkpoint dir
    if path.parent.name != CHECKPOINTS_DIR:
        raise CheckpointNotFoundError(f"{str(path)!r} is not inside a run's {CHECKPOINTS_DIR}/ directory")
    return path.parent.parent


def run_config_path(checkpoint_dir: str | Path) -> Path:
    """The run's resolved config (`<run>/config.yaml`) of a checkpoint; load it with
    `hybridflow.config.load_config(RunConfig, path)`."""
    path = run_dir_of(checkpoint_dir) / "config.yaml"
    if not path.is_file():
        raise CheckpointNotFoundError(f"the run of checkpoint {str(checkpoint_dir)!r} has no config.yaml "
                                      f"(looked for {str(path)!r})")
    return path


@dataclass(frozen=True)
class SavedRun:
    """A checkpoint to resume and its run's saved config tree (config.yaml, read once: the
    CLI builds the resumed config from this tree and the trainer compares against it)."""

    checkpoint: Path
    tree: dict[str, Any]


def saved_run(resume: str | Path | SavedRun) -> SavedRun:
    """The newest complete checkpoint of a run directory (or that checkpoint directory)
    with its run's config.yaml, read now; a SavedRun as it is."""
    if isinstance(resume, SavedRun):
        return resume
    checkpoint = find_checkpoint(resume)
    return SavedRun(checkpoint, user_tree(run_config_path(checkpoint)))


# ----------------------------------------------------------------------------- saving


# Written the way engine checkpoints are (engines/train/checkpoint.py): into a `.tmp-`
# sibling, renamed into place when complete, old ones renamed to `.tmp-` before deletion.


def begin_checkpoint(run_dir: str | Path, step: int) -> Path:
    """A fresh, empty `.tmp-global_step_<step>` to write step `step` into. Leftovers of an
    interrupted save (`.tmp-*`) are removed first: they were never complete."""
    return begin_atomic_dir(Path(run_dir) / CHECKPOINTS_DIR / f"{STEP_PREFIX}{step}")


def write_trainer_state(checkpoint_dir: Path, state: dict[str, Any]) -> None:
    """The trainer state file, written last into a checkpoint (its presence marks it complete)."""
    write_text_atomically(checkpoint_dir / TRAINER_STATE_FILE, json.dumps(state))


def commit_checkpoint(tmp: Path, state: dict[str, Any], keep_last: int | None) -> Path:
    """Write the trainer state (`state`, of STATE_VERSION) into `tmp` (every role's files are
    already there), make the checkpoint visible by renaming it to `global_step_<step>`, then
    keep only `keep_last` checkpoints (None: all): this one and the newest others. Returns
    the checkpoint directory."""
    with writing_checkpoint(tmp):  # FILES_KEY: what `damaged_files` checks
        write_trainer_state(tmp, {"version": STATE_VERSION, **state, FILES_KEY: checkpoint_files(tmp)})
    final = publish_atomic_dir(tmp)
    if keep_last is not None:
        prune_atomic_dirs(complete_checkpoints(final.parent), keep_last, keep=final)
    return final


def read_trainer_state(checkpoint_dir: str | Path) -> dict[str, Any]:
    """The trainer state of a complete checkpoint (the tasks' `save_checkpoint`)."""
    path = Path(checkpoint_dir) / TRAINER_STATE_FILE
    try:
        state = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise CheckpointDamagedError(
            f"{str(path)!r} is not valid JSON ({type(err).__name__}: {err}): this checkpoint is damaged. Resume from an older one "
            f"(--resume {Path(checkpoint_dir).parent}/{STEP_PREFIX}<M>), or move this one aside and pass the "
            "run directory") from None
    if not isinstance(state, dict):
        raise CheckpointDamagedError(f"{str(path)!r} holds no JSON object: this checkpoint is damaged")
    if state.get("version") != STATE_VERSION:
        raise UserInputError(f"{str(path)!r} has trainer-state version {state.get('version')!r}; this hybridflow "
                             f"reads version {STATE_VERSION}. Resume with the hybridflow version that wrote it")
    return state


# ----------------------------------------------------------------------------- controller RNG


def controller_rng_state() -> dict[str, Any]:
    """The controller process's global RNGs (Python, NumPy, torch) as JSON-safe values."""
    py_version, py_state, py_gauss = random.getstate()
    np_state = np.random.get_state()
    return {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii"),
    }


def set_controller_rng_state(state: dict[str, Any]) -> None:
    """Restore what `controller_rng_state` captured."""
    version, py_state, gauss = state["python"]
    random.setstate((version, tuple(py_state), gauss))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))
    raw = np.frombuffer(base64.b64decode(state["torch"]), dtype=np.uint8).copy()
    torch.set_rng_state(torch.from_numpy(raw))


# ----------------------------------------------------------------------------- resuming in a run directory


def reopen_run_dir(cfg: RunConfig, checkpoint: Path | SavedRun, keep_phases: tuple[str, ...] = ("sft",),
                   exports: tuple[str, ...] = ("final_model",)) -> Path:
    """The run directory of `checkpoint` (a checkpoint directory, or a SavedRun: one whose
    config.yaml was read already), prepared to continue after the checkpoint's step (call
    before the loggers open metrics.jsonl); nothing in it is deleted:

    - config.yaml: replaced by `cfg` when that differs (e.g. a larger trainer.total_steps);
      the previous one is kept as config.before-resume-step<step>[-k].yaml.
    - metrics.jsonl: records after the checkpoint (steps the crashed or stopped run did past
      `step`, which the resumed run does again) would appear twice; the file keeps the
      records up to `step` (and every record of `keep_phases`: a warm start's "sft" precedes
      RL), and the full original is kept as metrics.before-resume-step<step>[-k].jsonl.
    - final_model/ (the `exports` of the run's kind: sft_model/ of `hybridflow sft`, ...): the
      earlier attempt's export (if it finished) moves to final_model.before-resume-step<step>[-k]/;
      the resumed run exports a new one.
    - checkpoints past `step` (resuming from an older one), which the resumed run would
      write over as it reaches their steps, move to
      checkpoints/global_step_<N>.before-resume-step<step>[-k]/ (no checkpoint to resume).
    """
    saved = checkpoint.tree if isinstance(checkpoint, SavedRun) else None
    checkpoint_dir = checkpoint.checkpoint if isinstance(checkpoint, SavedRun) else checkpoint
    run_dir, step = run_dir_of(checkpoint_dir), checkpoint_step(checkpoint_dir)
    config_path = run_dir / "config.yaml"
    if saved is None and config_path.is_file():
        saved = yaml.safe_load(config_path.read_text())
    if saved != config_to_dict(cfg):
        if config_path.is_file():
            os.replace(config_path, _unused(run_dir, f"config.before-resume-step{step}", ".yaml"))
        save_config(cfg, config_path)
    metrics_path = run_dir / "metrics.jsonl"
    if metrics_path.is_file():
        text = metrics_path.read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        kept = [line for line, record in metrics_lines(text, str(metrics_path))
                if record["phase"] in keep_phases or int(record["step"]) <= step]
        if len(kept) != len(lines):
            shutil.copy2(metrics_path, _unused(run_dir, f"metrics.before-resume-step{step}", ".jsonl"))
            write_text_atomically(metrics_path, "".join(kept))
    for name in exports:
        if (run_dir / name).exists():
            path = Path(name)
            os.replace(run_dir / name, _unused(run_dir, f"{path.stem}.before-resume-step{step}", path.suffix))
    for later in complete_checkpoints(run_dir / CHECKPOINTS_DIR):
        if checkpoint_step(later) > step:
            os.replace(later, _unused(later.parent, f"{later.name}.before-resume-step{step}", ""))
    return run_dir


def _unused(directory: Path, stem: str, suffix: str) -> Path:
    """directory/<stem><suffix>, or with -1, -2, ... when that exists (never overwrite)."""
    for k in range(10_000):
        path = directory / f"{stem}{'' if k == 0 else f'-{k}'}{suffix}"
        if not path.exists():
            return path
    raise RuntimeError(f"too many files named {stem}-<k>{suffix} in {directory}")


def logged_accuracy(run_dir: Path, step: int, phase: str = "eval") -> float | None:
    """val/accuracy of the run's `phase` record at `step` in metrics.jsonl (None if absent)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    for record in read_metrics(path):
        if record["phase"] == phase and record["step"] == step and "val/accuracy" in record:
            return record["val/accuracy"]
    return None
