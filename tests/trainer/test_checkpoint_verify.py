"""Every file of a checkpoint is checked on the controller before Ray starts
(trainer/run/verify.py, from `find_checkpoint`, which eval, export and --resume call
first): a damaged DCP shard entry, a shard path that leaves the checkpoint, a payload in a
`.pt` file or a shard's non-tensor entry, a planted saved batch are each one line naming
the file, exit status 2, never torch's advice to load the file unrestricted and never a
worker's `CheckpointException`."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from hybridflow.cli import main
from hybridflow.config import save_config
from hybridflow.engines.train.dcp_reader import read_dcp_metadata
from hybridflow.errors import UserInputError
from hybridflow.trainer.run.checkpointing import FILES_KEY, TRAINER_STATE_FILE, checkpoint_files, find_checkpoint
from hybridflow.trainer.run.lifecycle import base_model_path
from tests.checkpoints import SHARD, actor_state, write_run_checkpoint
from tests.payload import Payload
from tests.processes import run_cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def entry_span(checkpoint: Path, fqn: str) -> tuple[int, int]:
    info = next(v for k, v in read_dcp_metadata(checkpoint / "actor").storage_data.items() if k.fqn == fqn)
    return info.offset, info.length


def overwrite(path: Path, offset: int, data: bytes) -> None:
    """Damage `path` in place, keeping its size (the sizes trainer_state.json records still match)."""
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)


def rerecorded(checkpoint: Path) -> Path:
    """`checkpoint` with the file sizes trainer_state.json records updated (what a tamperer does)."""
    path = checkpoint / TRAINER_STATE_FILE
    state = json.loads(path.read_text())
    path.write_text(json.dumps({**state, FILES_KEY: checkpoint_files(checkpoint)}))
    return checkpoint


def refused(checkpoint: Path) -> str:
    """The one line `find_checkpoint` (what eval, export and --resume call first) refuses with."""
    with pytest.raises(UserInputError) as err:
        find_checkpoint(checkpoint)
    return refused_line(err)


def refused_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and "weights_only" not in text and "CheckpointException" not in text
    return text


def test_a_real_checkpoint_passes(tmp_path):
    checkpoint = write_run_checkpoint(tmp_path / "run")
    assert find_checkpoint(checkpoint) == checkpoint


def test_a_damaged_tensor_entry_names_the_shard_and_the_entry(tmp_path):
    checkpoint = write_run_checkpoint(tmp_path / "run")
    offset, _ = entry_span(checkpoint, "model.weight")
    overwrite(checkpoint / SHARD, offset, b"\xff" * 64)
    assert "__0_0.distcp: the entry 'model.weight' is damaged" in refused(checkpoint)


def test_a_tensor_entry_of_another_shape_is_refused(tmp_path):
    checkpoint = write_run_checkpoint(tmp_path / "run")
    # The bias's archive where the weight's metadata points: a valid tensor, not the one described.
    metadata = read_dcp_metadata(checkpoint / "actor")
    bias = next(v for k, v in metadata.storage_data.items() if k.fqn == "model.bias")
    weight = next(k for k in metadata.storage_data if k.fqn == "model.weight")
    metadata.storage_data[weight] = bias
    (checkpoint / "actor" / ".metadata").write_bytes(pickle.dumps(metadata))
    line = refused(rerecorded(checkpoint))
    assert "'model.weight' is damaged" in line and "shape [4]" in line


def test_a_shard_path_outside_the_checkpoint_is_refused(tmp_path):
    checkpoint = write_run_checkpoint(tmp_path / "run")
    metadata = read_dcp_metadata(checkpoint / "actor")
    for info in metadata.storage_data.values():
        info.relative_path = "../../../elsewhere.distcp"
    (checkpoint / "actor" / ".metadata").write_bytes(pickle.dumps(metadata))
    assert "points to '../../../elsewhere.distcp', not a shard file beside it" in refused(rerecorded(checkpoint))


@pytest.mark.parametrize("where", ["engine_state.pt", "shard entry"])
def test_a_payload_is_refused_not_run(tmp_path, where):
    marker = tmp_path / "payload-ran"
    state = actor_state()
    if where == "shard entry":
        state["optim"]["param_groups"][0]["lr"] = Payload(marker)  # a pickled non-tensor entry
    checkpoint = write_run_checkpoint(tmp_path / "run", state=state)
    if where == "engine_state.pt":
        torch.save({"global_step": 1, "evil": Payload(marker)}, checkpoint / "actor" / "engine_state.pt")
    line = refused(rerecorded(checkpoint))
    assert "not loaded" in line and "Unsupported global" in line and not marker.exists()


def test_a_planted_saved_batch_is_one_line(tmp_path):
    checkpoint = write_run_checkpoint(tmp_path / "run")
    size = (checkpoint / "prompts.dataproto").stat().st_size
    (checkpoint / "prompts.dataproto").write_bytes(b"\x80\x04not a batch".ljust(size, b"\0"))
    assert "prompts.dataproto' is not a DataProto file" in refused(checkpoint)


def test_eval_of_a_damaged_shard_ends_before_ray_starts(tmp_path, tiny_config):
    run_dir = tmp_path / "run"
    checkpoint = write_run_checkpoint(run_dir)
    cfg = tiny_config("resources.world_size=1")
    save_config(cfg, run_dir / "config.yaml")
    base_model_path(cfg, run_dir, write_builtin=True)  # the run's starting model, as a run writes it
    offset, _ = entry_span(checkpoint, "model.weight")
    overwrite(checkpoint / SHARD, offset, b"\xff" * 64)
    result = run_cli(["eval", str(run_dir)], tmp_path)
    assert result.returncode == 2 and not result.ray_started, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "__0_0.distcp: the entry 'model.weight'" in result.stderr


def test_a_planted_pending_batch_of_an_environment_run_is_exit_2(tmp_path, capsys):
    common = [f"trainer.output_dir={tmp_path}", "trainer.console=none", "trainer.target_return=null",
              "trainer.save_freq=256", "ppo.epochs=1"]
    assert main(["train", "--config", str(EXAMPLES / "ppo_cartpole.yaml"), "trainer.total_env_steps=256",
                 *common]) == 0
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    checkpoint = run_dir / "checkpoints" / "global_step_1"
    (checkpoint / "pending" / "0.dataproto").write_bytes(b"planted")
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "trainer.total_env_steps=512"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "pending/0.dataproto' is not a DataProto file" in err

