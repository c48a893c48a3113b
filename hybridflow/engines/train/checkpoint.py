"""Sharded, atomic training checkpoints with torch.distributed.checkpoint (DCP).

Layout under a checkpoint root (a filesystem every rank can write, e.g. shared storage):

    root/global_step_<n>/          one complete checkpoint
        .metadata, __*_*.distcp    DCP shards: model + optimizer state
        engine_state.pt            global step, lr-scheduler state (rank 0)
        rng_rank<r>.pt             torch / CUDA / shuffle RNG states of rank r
        extra_rank<r>.pt           the caller's state of rank r (optional; a worker's counters)
    root/latest_checkpointed_step.txt   the step of the newest complete checkpoint

Atomicity: a checkpoint is written into `root/.tmp-global_step_<n>` and renamed into
place only after every rank has finished writing, and the `latest` pointer is replaced
with os.replace afterwards; both are atomic on POSIX filesystems. A crash at any moment
therefore leaves the previous checkpoint and pointer intact; a stale `.tmp-*` directory
is ignored by loading and removed by the next save. `write_checkpoint` writes the same
files into an exact directory for callers that make a bigger checkpoint atomic themselves
(the RL trainer's <run>/checkpoints/global_step_<n>/<role>).

DCP stores tensors by name with their global shapes, so a checkpoint can be loaded
with another dp x tp layout; RNG states are restored only when the world size matches.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from hybridflow.engines.train.engine import TrainEngine

LATEST_FILE = "latest_checkpointed_step.txt"
_STEP_PREFIX = "global_step_"
_TMP_PREFIX = ".tmp-"


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{_STEP_PREFIX}{step}"


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under `root` (via the pointer file), or None."""
    pointer = Path(root) / LATEST_FILE
    if not pointer.is_file():
        return None
    path = step_dir(root, int(pointer.read_text().strip()))
    return path if (path / ".metadata").is_file() else None


def _model_and_optim_state(engine: TrainEngine) -> dict:
    if engine.optimizer is None:
        model_sd, _ = get_state_dict(engine.model, [])
        return {"model": model_sd}
    model_sd, optim_sd = get_state_dict(engine.model, engine.optimizer)
    return {"model": model_sd, "optim": optim_sd}


def _rng_state(engine: TrainEngine) -> dict:
    state = {"torch": torch.get_rng_state(), "shuffle": engine.shuffle_generator.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_checkpoint(engine: TrainEngine, directory: str | Path, *, extra: dict | None = None) -> Path:
    """Write the engine's checkpoint into exactly `directory` (collective; created by rank 0).

    Not atomic by itself: for callers that write a larger checkpoint (several engines plus
    their own state) into a temporary directory and rename it into place when complete.
    `extra`: this rank's picklable caller state (e.g. a worker's counters), read back with
    `load_extra`.
    """
    directory = Path(directory)
    rank = dist.get_rank()
    if rank == 0:
        directory.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dcp.save(_model_and_optim_state(engine), checkpoint_id=directory)
    torch.save(_rng_state(engine), directory / f"rng_rank{rank}.pt")
    if extra is not None:
        torch.save(extra, directory / f"extra_rank{rank}.pt")
    if rank == 0:
        state = {"global_step": engine.global_step, "world_size": dist.get_world_size()}
        if engine.lr_scheduler is not None:
            state["lr_scheduler"] = engine.lr_scheduler.state_dict()
        torch.save(state, directory / "engine_state.pt")
    dist.barrier()  # every rank's files are on disk when any rank returns
    return directory


def save_checkpoint(engine: TrainEngine, root: str | Path, *, keep_last: int | None = None,
                    extra: dict | None = None) -> Path:
    """Save the engine at its current `global_step` (collective). Returns the checkpoint dir.

    keep_last: after the new checkpoint is complete, delete all but the newest
    `keep_last` step directories (None keeps everything). extra: see `write_checkpoint`.
    """
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 or None, got {keep_last}")
    root = Path(root)
    rank = dist.get_rank()
    final = step_dir(root, engine.global_step)
    tmp = root / f"{_TMP_PREFIX}{final.name}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(f"{_TMP_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    write_checkpoint(engine, tmp, extra=extra)  # ends with a barrier: tmp is complete
    if rank == 0:
        if final.exists():  # re-saving a step: move the old copy aside, then swap
            old = root / f"{_TMP_PREFIX}old-{final.name}"
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
        _atomic_write_text(root / LATEST_FILE, str(engine.global_step))
        if keep_last is not None:
            _prune(root, keep_last, keep=final)
    dist.barrier()
    return final


def _prune(root: Path, keep_last: int, keep: Path) -> None:
    steps = sorted(
        (int(p.name[len(_STEP_PREFIX):]), p) for p in root.glob(f"{_STEP_PREFIX}*") if p.name[len(_STEP_PREFIX):].isdigit()
    )
    for _, path in steps[:-keep_last]:
        if path != keep:
            shutil.rmtree(path, ignore_errors=True)


def load_checkpoint(engine: TrainEngine, path: str | Path) -> Path:
    """Restore model, optimizer, lr schedule, step and RNG (collective).

    `path` is a checkpoint directory or a root holding `latest_checkpointed_step.txt`.
    """
    path = Path(path)
    if not (path / ".metadata").is_file():
        latest = latest_checkpoint(path)
        if latest is None:
            raise FileNotFoundError(
                f"no complete checkpoint at {str(path)!r}: expected a global_step_<n> directory "
                f"with .metadata, or a root with {LATEST_FILE}"
            )
        path = latest
    state = _model_and_optim_state(engine)
    dcp.load(state, checkpoint_id=path)
    if engine.optimizer is None:
        set_state_dict(engine.model, [], model_state_dict=state["model"], optim_state_dict={})
    else:
        set_state_dict(engine.model, engine.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    extra = torch.load(path / "engine_state.pt", weights_only=False)
    engine.global_step = int(extra["global_step"])
    if engine.lr_scheduler is not None and "lr_scheduler" in extra:
        engine.lr_scheduler.load_state_dict(extra["lr_scheduler"])
    rng_file = path / f"rng_rank{dist.get_rank()}.pt"
    if extra["world_size"] == dist.get_world_size() and rng_file.is_file():
        rng = torch.load(rng_file, weights_only=False)
        torch.set_rng_state(rng["torch"])
        engine.shuffle_generator.set_state(rng["shuffle"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
    dist.barrier()
    return path


def load_extra(path: str | Path) -> dict | None:
    """This rank's caller state saved with the checkpoint at `path` (rank 0's when the
    world size changed and this rank has none), or None when none was saved."""
    path = Path(path)
    for rank in (dist.get_rank(), 0):
        file = path / f"extra_rank{rank}.pt"
        if file.is_file():
            return torch.load(file, weights_only=False)
    return None
