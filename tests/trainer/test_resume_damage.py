"""Resuming after damage, without workers (checkpoints as RLTrainer commits them): a
deleted or truncated shard in the newest checkpoint falls back to the older intact one; a
corrupt trainer_state.json is a short error; a metrics.jsonl whose last line was torn by a
crash is read; a model that changed since the checkpoint (its directory, or config.yaml's
model section) is refused; a payload planted in DCP's `.metadata` is refused by `export`, `eval` and
`--resume` before anything starts, and does not run."""

from __future__ import annotations

import json
import logging
import pickle
import shutil

import pytest
from torch.distributed.checkpoint.metadata import Metadata

from hybridflow.cli import main
from hybridflow.config import ConfigError, save_config
from hybridflow.trainer.run.checkpointing import (
    STATE_VERSION,
    CheckpointDamagedError,
    begin_checkpoint,
    commit_checkpoint,
    find_checkpoint,
    reopen_run_dir,
)
from hybridflow.trainer.run.lifecycle import MODEL_KEY, model_record, resume_config, resume_point
from hybridflow.trainer.run.run_dir import read_metrics
from tests.payload import Payload

SHARD = "actor/__0_0.distcp"


def checkpoint(run_dir, step: int, state: dict | None = None, metadata: Metadata | None = None):
    """A committed checkpoint with a 1000-byte stand-in shard (and an empty DCP `.metadata`)."""
    tmp = begin_checkpoint(run_dir, step)
    (tmp / "actor").mkdir()
    (tmp / "actor" / ".metadata").write_bytes(pickle.dumps(metadata or Metadata(state_dict_metadata={})))
    (tmp / SHARD).write_bytes(bytes(1000))
    return commit_checkpoint(tmp, {"version": STATE_VERSION, "global_step": step, **(state or {})}, None)


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_older_one(tmp_path, caplog, damage):
    run_dir = tmp_path / "run"
    older, newest = checkpoint(run_dir, 1), checkpoint(run_dir, 2)
    shard = newest / SHARD
    if damage == "deleted":
        shard.unlink()
    else:
        shard.write_bytes(bytes(600))
    with caplog.at_level(logging.WARNING):
        assert find_checkpoint(run_dir) == older
    assert "global_step_2 is damaged" in caplog.text and SHARD in caplog.text
    with pytest.raises(CheckpointDamagedError, match="Pass its run directory"):
        find_checkpoint(newest)
    shutil.rmtree(older)
    with pytest.raises(CheckpointDamagedError, match="every checkpoint"):
        find_checkpoint(run_dir)


def test_a_corrupt_trainer_state_is_a_short_error(tmp_path, tiny_config, capsys):
    run_dir = tmp_path / "run"
    newest = checkpoint(run_dir, 1)
    save_config(tiny_config(), run_dir / "config.yaml")
    (newest / "trainer_state.json").write_text('{"version": 1, "global_st')
    assert main(["train", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "trainer_state.json' is not valid JSON" in err and "damaged" in err and "Traceback" not in err


def test_a_torn_last_metrics_line_is_tolerated(tmp_path, tiny_config):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_config(tiny_config(), run_dir / "config.yaml")
    lines = [{"phase": "rl", "step": 1}, {"phase": "rl", "step": 2}]
    metrics = run_dir / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"phase": "rl", "st')
    assert read_metrics(metrics) == lines
    ckpt = checkpoint(run_dir, 1)
    reopen_run_dir(resume_config(ckpt, None), ckpt)
    assert read_metrics(metrics) == lines[:1]
    assert (run_dir / "metrics.before-resume-step1.jsonl").read_text().endswith('{"phase": "rl", "st')
    metrics.write_text('{"phase": "rl", "st\n' + json.dumps(lines[1]) + "\n")  # damage inside: an error
    with pytest.raises(ValueError, match="line 1 is not valid JSON"):
        read_metrics(metrics)


@pytest.fixture
def model_run(tmp_path, tiny_config):
    """A run on a model directory with a checkpoint that recorded that model."""
    from hybridflow.data import make_builtin_model_dir

    model = make_builtin_model_dir(tmp_path / "model")
    cfg = tiny_config(f"model.path={model}")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_config(cfg, run_dir / "config.yaml")
    return run_dir, model, checkpoint(run_dir, 1, {MODEL_KEY: model_record(cfg, str(model))})


def test_resume_refuses_a_model_directory_that_changed(tmp_path, model_run):
    from hybridflow.data import make_builtin_model_dir

    run_dir, model, _ = model_run
    assert resume_point(run_dir).step == 1  # unchanged: resumes
    shutil.rmtree(model)
    make_builtin_model_dir(model, num_hidden_layers=2)
    with pytest.raises(ConfigError, match=r"model.path: the model directory .* changed .*num_hidden_layers: 4 -> 2"):
        resume_point(run_dir)


def test_resume_refuses_an_edited_model_section(model_run):
    import yaml

    run_dir, _, _ = model_run
    tree = yaml.safe_load((run_dir / "config.yaml").read_text())
    tree["model"]["builtin"]["hidden_size"] = 128
    (run_dir / "config.yaml").write_text(yaml.safe_dump(tree))
    with pytest.raises(ConfigError, match="model.builtin.hidden_size: 32 -> 128"):
        resume_point(run_dir)


def test_resume_by_run_name_skips_a_damaged_newest_checkpoint(tmp_path, tiny_config):
    cfg = tiny_config("name=damaged", f"trainer.output_dir={tmp_path / 'runs'}")
    run_dir = tmp_path / "runs" / "damaged-20260101-120000"
    run_dir.mkdir(parents=True)
    save_config(cfg, run_dir / "config.yaml")
    older, newest = checkpoint(run_dir, 1), checkpoint(run_dir, 2)
    (newest / SHARD).unlink()
    assert resume_point(True, cfg).checkpoint == older


@pytest.mark.parametrize("command", ["export", "eval", "resume"])
def test_a_payload_planted_in_dcp_metadata_is_refused_before_anything_starts(tmp_path, tiny_config, capsys,
                                                                             command):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_config(tiny_config(), run_dir / "config.yaml")
    marker = tmp_path / "payload-ran"
    # DCP's real metadata carrying a payload; the sizes trainer_state.json records match it.
    checkpoint(run_dir, 1, metadata=Metadata(state_dict_metadata={}, storage_meta=Payload(marker)))
    argv = {"export": ["export", str(run_dir), "--out", str(tmp_path / "out")], "eval": ["eval", str(run_dir)],
            "resume": ["train", "--resume", str(run_dir)]}[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "actor/.metadata asks to load pathlib.Path.touch" in err and "not loaded" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not marker.exists() and not (tmp_path / "out").exists()
    pickle.loads((run_dir / "checkpoints" / "global_step_1" / "actor" / ".metadata").read_bytes())
    assert marker.exists()  # what DCP's own reader would have done
