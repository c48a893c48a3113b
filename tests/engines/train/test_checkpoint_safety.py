"""Checkpoints load only tensors and plain data (a planted pickle payload is refused, not
run), and a full disk while saving is one clear error naming the disk and the checkpoint,
with the earlier checkpoints intact."""

from __future__ import annotations

import resource
import signal
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

import hybridflow
from hybridflow.engines.train.checkpoint import (
    CheckpointSecurityError,
    DiskFullError,
    load_plain,
    writing_checkpoint,
)
from hybridflow.trainer.run.checkpointing import STATE_VERSION, begin_checkpoint, commit_checkpoint, find_checkpoint
from tests.payload import Payload


def test_a_planted_payload_is_refused_not_run(tmp_path):
    marker = tmp_path / "payload-ran"
    planted = tmp_path / "engine_state.pt"
    torch.save({"global_step": 3, "evil": Payload(marker)}, planted)
    with pytest.raises(CheckpointSecurityError, match="engine_state.pt.*not loaded") as refused:
        load_plain(planted)
    assert not marker.exists()
    # One line naming what was refused, not torch's page of advice to load it with weights_only=False.
    assert "\n" not in str(refused.value) and "weights_only" not in str(refused.value)
    assert "Unsupported global" in str(refused.value)
    torch.load(planted, weights_only=False)  # what the old loader did: the payload runs
    assert marker.exists()


def test_a_file_that_is_only_a_payload_is_one_line_without_warnings(tmp_path, recwarn):
    """A whole file replaced by a pickle of a payload (protocol 4, what `pickle.dumps` writes)."""
    import pickle

    marker = tmp_path / "payload-ran"
    planted = tmp_path / "rank0.pt"
    planted.write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(CheckpointSecurityError, match="rank0.pt.*not loaded") as refused:
        load_plain(planted)
    assert not marker.exists() and "\n" not in str(refused.value)
    assert not [w for w in recwarn if "pickle protocol" in str(w.message)]


def test_plain_checkpoint_data_still_loads(tmp_path):
    state = {"global_step": 3, "rng": torch.get_rng_state(), "lr": [0.1, 0.2], "name": "x", "none": None}
    torch.save(state, tmp_path / "ok.pt")
    loaded = load_plain(tmp_path / "ok.pt")
    assert loaded["global_step"] == 3 and torch.equal(loaded["rng"], state["rng"]) and loaded["lr"] == [0.1, 0.2]


def test_no_loader_unpickles_arbitrary_objects():
    root = Path(hybridflow.__file__).parent
    offenders = [str(p) for p in root.rglob("*.py") if "weights_only=False" in p.read_text()]
    assert offenders == []
    # Plain unpickling only where the bytes were verified: the environments of an env run,
    # signed with the user's key (trainer/env/state.py) before they reach the collector.
    unpicklers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                        if "pickle.loads(" in p.read_text() or "pickle.load(" in p.read_text())
    assert unpicklers == ["envs/collector.py"]


@contextmanager
def file_size_limit(limit: int):
    """Writes past `limit` bytes fail (EFBIG), as on a full disk."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def test_a_full_disk_while_writing_a_shard_names_the_disk_and_the_checkpoint(tmp_path):
    directory = tmp_path / "global_step_2"
    directory.mkdir()
    with pytest.raises(DiskFullError) as caught, file_size_limit(64 * 1024):
        with writing_checkpoint(directory):
            torch.save({"w": torch.zeros(1 << 16)}, directory / "rng_rank0.pt")  # 256 KiB
    message = str(caught.value)
    assert f"no space left while writing checkpoint {directory}" in message and "MiB free" in message
    assert "earlier" in message or "before it are intact" in message


def test_a_full_disk_while_committing_keeps_the_earlier_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    tmp = begin_checkpoint(run_dir, 1)
    (tmp / "actor").mkdir()
    (tmp / "actor" / "shard").write_bytes(bytes(100))
    first = commit_checkpoint(tmp, {"version": STATE_VERSION, "global_step": 1}, None)
    tmp = begin_checkpoint(run_dir, 2)
    (tmp / "actor").mkdir()
    (tmp / "actor" / "shard").write_bytes(bytes(100))
    with pytest.raises(DiskFullError, match="global_step_2"), file_size_limit(16):
        commit_checkpoint(tmp, {"version": STATE_VERSION, "global_step": 2, "pad": "x" * 100}, None)
    assert find_checkpoint(run_dir) == first
