"""DCP checkpoints are read without running code planted in them: a payload in `.metadata`
(DCP unpickles it) or in a shard's non-tensor entry (DCP torch.loads it with
weights_only=False) is refused by `load_dcp`; the same files run the payload under DCP's
own reader. (`hybridflow export` / `--resume` refuse it before any worker starts:
tests/trainer/test_resume_damage.py.)"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata

from hybridflow.engines.train.dcp_reader import CheckpointSecurityError, load_dcp, read_dcp_metadata
from hybridflow.errors import UserInputError
from tests.payload import Payload


def _state() -> dict:
    model = torch.nn.Linear(4, 3)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    optim.step()
    return {"model": model.state_dict(), "optim": optim.state_dict()}


def _save(state: dict, directory: Path) -> Path:
    with pytest.warns(UserWarning, match="single process"):
        dcp.save(state, checkpoint_id=directory, no_dist=True)
    return directory


def _plant_in_metadata(directory: Path, marker: Path) -> None:
    """Rewrite `.metadata` as DCP's real metadata carrying a payload (what an attacker edits)."""
    metadata = pickle.loads((directory / ".metadata").read_bytes())
    metadata.storage_meta = Payload(marker)
    (directory / ".metadata").write_bytes(pickle.dumps(metadata))


def test_a_real_checkpoint_loads_with_every_entry(tmp_path):
    saved = _state()
    directory = _save(saved, tmp_path / "ck")
    assert isinstance(read_dcp_metadata(directory), Metadata)
    loaded = {"model": {k: torch.zeros_like(v) for k, v in saved["model"].items()},
              "optim": _state()["optim"]}
    load_dcp(loaded, directory)
    assert all(torch.equal(loaded["model"][k], v) for k, v in saved["model"].items())
    assert loaded["optim"]["param_groups"][0]["lr"] == 1e-3
    assert torch.equal(loaded["optim"]["state"][0]["exp_avg"], saved["optim"]["state"][0]["exp_avg"])


def test_a_payload_in_metadata_is_refused_not_run(tmp_path):
    directory = _save(_state(), tmp_path / "ck")
    marker = tmp_path / "payload-ran"
    _plant_in_metadata(directory, marker)
    with pytest.raises(CheckpointSecurityError, match=r"\.metadata asks to load pathlib\.Path\.touch, .*not loaded"):
        load_dcp(_state(), directory)
    assert not marker.exists()
    dcp.FileSystemReader(directory).read_metadata()  # DCP's own reader: the payload runs
    assert marker.exists()


def test_a_payload_in_a_shard_entry_is_refused_not_run(tmp_path):
    marker = tmp_path / "payload-ran"
    state = _state()
    state["optim"]["param_groups"][0]["lr"] = Payload(marker)  # saved as a pickled bytes entry
    directory = _save(state, tmp_path / "ck")
    with pytest.raises(CheckpointSecurityError, match="param_groups.*not loaded"):
        load_dcp(_state(), directory)
    assert not marker.exists()
    with pytest.warns(UserWarning, match="single process"):
        dcp.load(_state(), checkpoint_id=directory, no_dist=True)  # DCP's own planner: the payload runs
    assert marker.exists()


def test_a_damaged_shard_is_one_line_in_the_worker_too(tmp_path):
    # What a worker sees if a shard is damaged after the controller's check: our line naming
    # the checkpoint, not DCP's `CheckpointException ranks:dict_keys([0])`.
    directory = _save(_state(), tmp_path / "ck")
    info = next(v for k, v in read_dcp_metadata(directory).storage_data.items() if k.fqn == "model.weight")
    with open(directory / info.relative_path, "r+b") as shard:
        shard.seek(info.offset)
        shard.write(b"\xff" * 64)
    with pytest.raises(UserInputError, match=r"a shard could not be read .*the checkpoint cannot be loaded"):
        load_dcp(_state(), directory)


def test_a_refused_shard_entry_does_not_quote_torchs_advice(tmp_path):
    state = _state()
    state["optim"]["param_groups"][0]["lr"] = Payload(tmp_path / "payload-ran")
    directory = _save(state, tmp_path / "ck")
    with pytest.raises(CheckpointSecurityError) as refused:
        load_dcp(_state(), directory)
    text = str(refused.value)
    assert "\n" not in text and "\x1b" not in text  # one plain line
    assert not any(advice in text for advice in ("weights_only", "can still be loaded", "trust the source"))
    assert "Unsupported global" in text  # what was refused
