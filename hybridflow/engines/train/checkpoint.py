"""Sharded, atomic training checkpoints with torch.distributed.checkpoint (DCP)."""

from __future__ import annotations

import errno
import os
import pickle
import shutil
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from hybridflow.engines.train.dcp_reader import (
    DAMAGED_HINT,
    CheckpointFileError,
    CheckpointSecurityError,
    load_dcp,
    unpickler_reason,
)
from hybridflow.engines.train.engine import TrainEngine

LATEST_FILE = "latest_checkpointed_step.txt"
_STEP_PREFIX = "global_step_"
TMP_PREFIX = ".tmp-"  # a directory being written, set aside or deleted; never a checkpoint


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
    with writing_checkpoint(directory):
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


class DiskFullError(OSError):
    """A checkpoint could not be written: its disk (or the process's file-size limit) is full."""


@contextmanager
def writing_checkpoint(directory: Path) -> Iterator[None]:
    """Turn a full disk while writing `directory` into a DiskFullError that names the disk,
    its free space and the checkpoint. torch.save reports it as "unexpected pos ..." from
    its zip writer, DCP and plain writes as ENOSPC; EFBIG is a file-size limit (ulimit -f)."""
    try:
        yield
    except (OSError, RuntimeError) as err:
        text = str(err)
        full = getattr(err, "errno", None) in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
        if not (full or "No space left" in text or "unexpected pos" in text or "File too large" in text):
            raise
        raise DiskFullError(errno.ENOSPC, f"no space left while writing checkpoint {directory}: {_disk_of(directory)}. "
                            "The checkpoints before it are intact; free space there (or point "
                            "trainer.output_dir at a larger disk) and continue with --resume") from err


def _disk_of(path: Path) -> str:
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("/"))
    usage = shutil.disk_usage(existing)
    return f"the disk holding {existing} has {usage.free / 2**20:.0f} MiB free of {usage.total / 2**20:.0f} MiB"


def save_checkpoint(engine: TrainEngine, root: str | Path, *, keep_last: int | None = None,
                    extra: dict | None = None) -> Path:
    """Save the engine at its current `global_step` (collective). Returns the checkpoint dir.

    keep_last: after the new checkpoint is complete, delete all but the newest
    `keep_last` step directories (None keeps everything). extra: see `write_checkpoint`.
    """
    _check_keep_last(keep_last)
    root = Path(root)
    rank = dist.get_rank()
    final = step_dir(root, engine.global_step)
    if rank == 0:
        begin_atomic_dir(final)
    write_checkpoint(engine, atomic_tmp_dir(final), extra=extra)  # ends with a barrier: complete
    if rank == 0:
        publish_atomic_dir(atomic_tmp_dir(final))
        # The pointer moves before pruning: it never names a directory being deleted.
        write_text_atomically(root / LATEST_FILE, str(engine.global_step))
        if keep_last is not None:
            prune_atomic_dirs(_step_dirs(root), keep_last, keep=final)
    dist.barrier()
    return final


def _step_dirs(root: Path) -> list[Path]:
    """The `global_step_<n>` directories under `root`, oldest step first (only a completed
    save renames a directory to that name)."""
    steps = [p for p in root.glob(f"{_STEP_PREFIX}*") if p.name[len(_STEP_PREFIX):].isdigit()]
    return sorted(steps, key=lambda p: int(p.name[len(_STEP_PREFIX):]))


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
    load_dcp(state, path)
    if engine.optimizer is None:
        set_state_dict(engine.model, [], model_state_dict=state["model"], optim_state_dict={})
    else:
        set_state_dict(engine.model, engine.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    extra = load_plain(path / "engine_state.pt")
    engine.global_step = int(extra["global_step"])
    if engine.lr_scheduler is not None and "lr_scheduler" in extra:
        engine.lr_scheduler.load_state_dict(extra["lr_scheduler"])
    rng_file = path / f"rng_rank{dist.get_rank()}.pt"
    if extra["world_size"] == dist.get_world_size() and rng_file.is_file():
        rng = load_plain(rng_file)
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
            return load_plain(file)
    return None


def load_plain(path: str | Path, *, mmap: bool = False) -> Any:
    """A `torch.save`d file that may hold only tensors and plain data (dicts, lists,
    numbers, strings): `weights_only=True`, so a planted pickle payload in a checkpoint is
    refused instead of run; a damaged file is a CheckpointFileError. Both name the file in
    one line. `mmap`: map the tensors' data instead of reading it (a check of the file)."""
    try:
        with warnings.catch_warnings():  # torch warns about a planted file's pickle protocol before refusing it
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            return torch.load(path, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        raise CheckpointSecurityError(
            f"{str(path)!r} holds Python objects other than tensors and plain data; it was not written by "
            f"hybridflow (or was tampered with), and is not loaded: code inside it could run "
            f"({unpickler_reason(err)})"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, TypeError, KeyError, AttributeError, IndexError,
            MemoryError, RecursionError, OverflowError) as err:
        reason = (str(err).strip().splitlines() or [""])[0][:300]
        raise CheckpointFileError(f"{str(path)!r} is damaged or cut short ({type(err).__name__}: {reason}); "
                                  f"{DAMAGED_HINT}") from None


# ----------------------------------------------------------------------------- atomic directories
# One protocol for every checkpoint directory (these engine checkpoints and the trainer's
# run checkpoints): write into a `.tmp-` sibling, rename it into place when complete, and
# delete old ones by renaming them to `.tmp-` first, so that no half-written or half-deleted
# directory ever carries a checkpoint's name.


def atomic_tmp_dir(final: Path) -> Path:
    """Where `final` is written before `publish_atomic_dir` renames it into place."""
    return final.with_name(f"{TMP_PREFIX}{final.name}")


def begin_atomic_dir(final: str | Path) -> Path:
    """A fresh, empty `atomic_tmp_dir(final)` to write `final` into. Leftovers of interrupted
    writes (every `.tmp-*` beside it) are removed first: they never completed."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f"{TMP_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = atomic_tmp_dir(final)
    tmp.mkdir()
    return tmp


def publish_atomic_dir(tmp: Path) -> Path:
    """Rename the finished `tmp` (from `begin_atomic_dir`) to its final name and make the
    rename durable. An existing directory of that name (the same step saved again) is set
    aside first and deleted after the swap, so a complete copy exists at every moment."""
    if not tmp.name.startswith(TMP_PREFIX):
        raise ValueError(f"{str(tmp)!r} is not a directory from begin_atomic_dir (no {TMP_PREFIX!r} prefix)")
    final = tmp.with_name(tmp.name[len(TMP_PREFIX):])
    if final.exists():
        aside = final.with_name(f"{TMP_PREFIX}old-{final.name}")
        final.rename(aside)
        tmp.rename(final)
        shutil.rmtree(aside)
    else:
        tmp.rename(final)
    _fsync_dir(final.parent)
    return final


def prune_atomic_dirs(existing: Sequence[Path], keep_last: int, keep: Path) -> list[Path]:
    """Delete all but `keep_last` of `existing` (complete directories, oldest first): `keep`
    (the one just published, even when older ones sort after it) and the newest others.
    Returns the deleted ones."""
    _check_keep_last(keep_last)
    others = [p for p in existing if p != keep]
    doomed = others[:max(0, len(others) - (keep_last - 1))]
    for path in doomed:
        trash = path.with_name(f"{TMP_PREFIX}delete-{path.name}")
        path.rename(trash)
        shutil.rmtree(trash)
    return doomed


def write_text_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` in one step (a reader sees the old or the new file, never
    a partial one), flushed to disk before the rename."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    # Makes a rename inside `path` durable (POSIX); skipped where directories cannot be opened.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_keep_last(keep_last: int | None) -> None:
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 (or None to keep every checkpoint), got {keep_last}")
