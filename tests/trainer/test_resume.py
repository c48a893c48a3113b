"""Runs that survive: checkpoints every trainer.save_freq steps, resume, crash safety.

One reference run (PPO with an adaptive KL coefficient in the reward, so the checkpoint
must carry the actor, the critic, the reference policy's inputs and the KL controller)
trains 3 steps without stopping. On 8 prompts in batches of 4 an epoch is 2 steps, so a
checkpoint at step 2 sits exactly on an epoch boundary and one at step 1 mid-epoch. A
run stopped after k steps and resumed must log the reference's metrics for steps k+1..3
(timings excluded).

    .venv/bin/python -m pytest -q tests/trainer/test_resume.py
"""

from __future__ import annotations

import json
import pickle
import random
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.distributed.checkpoint.metadata import Metadata

from hybridflow import RLTrainer
from hybridflow.cli import main
from hybridflow.config import ConfigError, load_config, save_config
from hybridflow.config.schema import RunConfig
from hybridflow.trainer.run.checkpointing import (
    STATE_VERSION,
    CheckpointNotFoundError,
    actor_checkpoint_path,
    begin_checkpoint,
    commit_checkpoint,
    complete_checkpoints,
    controller_rng_state,
    find_checkpoint,
    read_trainer_state,
    reopen_run_dir,
    run_config_path,
    set_controller_rng_state,
)
from hybridflow.trainer.run.lifecycle import resume_config
from hybridflow.trainer.run.run_dir import read_metrics
from trainer_helpers import rl_records

# An epoch is 8 / 4 = 2 steps; rollout sampling at temperature 1 (the default) so that
# the generation seed counter matters.
CASE = ("algorithm.name=ppo", "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive",
        "data.builtin.num_train=8", "trainer.save_freq=1", "trainer.val_before_train=false")
TOTAL = 3

# Run in a subprocess: train with a checkpoint every step, and die by SIGKILL (the whole
# process group: the controller and its reward processes) in the middle of saving step 2,
# after every role's files and the trainer state are written but before the checkpoint is
# renamed into place.
CRASHING_RUN = '''
import os, signal, sys
from pathlib import Path
from hybridflow import RLTrainer
from hybridflow.config import load_config
from hybridflow.config.schema import RunConfig
from hybridflow.trainer import task as rl_trainer
from hybridflow.trainer.run import checkpointing

def commit_or_die(tmp, state, keep_last):
    if state["global_step"] == 2:
        checkpointing.write_trainer_state(tmp, state)
        os.killpg(os.getpgid(0), signal.SIGKILL)
    return checkpointing.commit_checkpoint(tmp, state, keep_last)

if __name__ == "__main__":  # the reward worker processes import this module again
    rl_trainer.commit_checkpoint = commit_or_die
    with RLTrainer(load_config(RunConfig, sys.argv[1])) as trainer:
        trainer.train()
'''


def compared(record: dict) -> dict:
    """A step's metrics without wall-clock numbers and the controller's fetch counts (a fresh
    controller looks up each group's mesh once more)."""
    return {k: v for k, v in record.items() if not k.startswith(("timing_s/", "perf/", "controller/")) and k != "time"}


def assert_same_steps(run_dir, reference: list[dict], steps: list[int]) -> None:
    got = {r["step"]: compared(r) for r in rl_records(run_dir)}
    want = {r["step"]: compared(r) for r in reference}
    assert sorted(got) == list(range(1, TOTAL + 1)), sorted(got)  # every step logged once
    for step in steps:
        assert got[step].keys() == want[step].keys()
        for key, value in want[step].items():
            expected = pytest.approx(value, rel=1e-5, abs=1e-6) if isinstance(value, float) else value
            assert got[step][key] == expected, (step, key)


@pytest.fixture(scope="module")
def reference(ray_local, module_tiny_config):
    """The uninterrupted run's per-step metrics (checkpoints every step, newest 2 kept)."""
    cfg = module_tiny_config(*CASE, f"trainer.total_steps={TOTAL}", "trainer.keep_last_checkpoints=2")
    with RLTrainer(cfg) as trainer:
        result = trainer.train()
    return result.run_dir, rl_records(result.run_dir)


# Each Ray test starts 2-rank PPO worker groups (~20 s on 2 cores) once or twice: about
# 30-45 s (the reference run), 35-60 s and 60-100 s on this machine, hence slow.
@pytest.mark.slow
@pytest.mark.extended  # pruning: test_commit_prune_and_find_see_only_complete_checkpoints (no workers)
def test_keep_last_checkpoints_prunes_older_ones(reference):
    run_dir, records = reference
    assert [r["step"] for r in records] == [1, 2, 3]
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == ["global_step_2", "global_step_3"]  # step 1 pruned, no temporary left
    newest = find_checkpoint(run_dir)
    assert newest.name == "global_step_3" and find_checkpoint(newest) == newest
    assert read_trainer_state(newest)["loader"]["epoch"] == 1  # 3 steps of a 2-step epoch
    assert (newest / "actor" / ".metadata").is_file() and (newest / "critic" / ".metadata").is_file()
    assert actor_checkpoint_path(newest) == str(newest / "actor")
    # The generation seed counter of every actor rank: one sampled generate call per step.
    for rank in (0, 1):
        assert torch.load(newest / "actor" / f"extra_rank{rank}.pt")["generate_calls"] == 3
    assert run_config_path(newest) == (run_dir / "config.yaml").resolve()


@pytest.mark.slow
def test_stop_at_an_epoch_boundary_and_resume_gives_the_uninterrupted_metrics(reference, tiny_config):
    _, want = reference
    final = "trainer.save_final_model=true"
    with RLTrainer(tiny_config(*CASE, "trainer.total_steps=2", final)) as trainer:  # stops after step 2
        run_dir = trainer.train().run_dir
    state = read_trainer_state(find_checkpoint(run_dir))
    assert state["global_step"] == 2 and (state["loader"]["epoch"], state["loader"]["offset"]) == (1, 0)
    assert state["algorithm"]["kl_ctrl"]["value"] != want[0]["kl/coef"]  # the adaptive coefficient moved

    # The saved config is used, with a larger total_steps; the next epoch is trained.
    with RLTrainer(tiny_config(*CASE, f"trainer.total_steps={TOTAL}", final), resume=run_dir) as trainer:
        assert trainer.run_dir == run_dir and trainer.global_step == 2
        result = trainer.train()
    assert result.steps == TOTAL
    # The first attempt's export is kept aside, never overwritten by the resumed run's.
    assert (run_dir / "final_model.before-resume-step2" / "config.json").is_file()
    assert (run_dir / "final_model" / "config.json").is_file()
    assert_same_steps(run_dir, want, [3])
    assert read_trainer_state(find_checkpoint(run_dir))["loader"] == {**state["loader"], "offset": 1}

    with pytest.raises(ConfigError, match="rollout.temperature: saved 1.0, now 0.5"):
        RLTrainer(tiny_config(*CASE, "rollout.temperature=0.5"), resume=run_dir)
    with RLTrainer(resume=run_dir) as trainer, pytest.raises(ConfigError, match="nothing to train"):
        trainer.train()


@pytest.mark.slow
def test_a_crash_while_saving_leaves_the_previous_checkpoint_and_the_cli_resumes_it(reference, tiny_config,
                                                                                    tmp_path, capsys):
    _, want = reference
    cfg = tiny_config(*CASE, f"trainer.total_steps={TOTAL}", "name=crashing")
    config_file = save_config(cfg, tmp_path / "run.yaml")
    script, log = tmp_path / "crashing_run.py", tmp_path / "crashing_run.log"
    script.write_text(CRASHING_RUN)
    with log.open("w") as out:  # a file, not a pipe: nothing waits for the killed run's descendants
        proc = subprocess.run([sys.executable, str(script), str(config_file)], start_new_session=True,
                              stdout=out, stderr=subprocess.STDOUT, timeout=600)
    assert proc.returncode == -signal.SIGKILL, log.read_text()[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    checkpoints = run_dir / "checkpoints"
    assert (checkpoints / ".tmp-global_step_2" / "trainer_state.json").is_file()  # fully written, not committed
    assert find_checkpoint(run_dir) == checkpoints / "global_step_1"
    with pytest.raises(CheckpointNotFoundError, match="unfinished checkpoint"):
        find_checkpoint(checkpoints / ".tmp-global_step_2")
    assert [r["step"] for r in rl_records(run_dir)] == [1, 2]  # step 2 was logged before the save

    # `--resume` without PATH: the newest checkpoint of the runs named "crashing".
    assert main(["train", "--resume", "name=crashing", f"trainer.output_dir={tmp_path / 'runs'}"]) == 0
    assert_same_steps(run_dir, want, [2, 3])  # resumed mid-epoch, crossing into the next epoch
    assert sorted(p.name for p in checkpoints.iterdir()) == ["global_step_1", "global_step_2", "global_step_3"]
    archived = read_metrics(run_dir / "metrics.before-resume-step1.jsonl")
    assert [r["step"] for r in archived if r["phase"] == "rl"] == [1, 2]  # nothing the run wrote is lost

    assert main(["train", "--resume", str(run_dir)]) == 2  # at total_steps already
    assert "raise trainer.total_steps" in capsys.readouterr().err


def test_resume_errors_say_what_is_wrong(tmp_path, capsys):
    with pytest.raises(CheckpointNotFoundError, match="no complete checkpoint"):
        find_checkpoint(tmp_path)
    assert main(["train", "--resume", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["train", "--resume", f"trainer.output_dir={tmp_path}"]) == 2
    assert "found no checkpoint" in capsys.readouterr().err


# ----------------------------------------------------------------------------- without workers


def fake_checkpoint(run_dir, step: int, keep_last=None):
    """A checkpoint as RLTrainer.save_checkpoint commits it, with a stand-in role file."""
    tmp = begin_checkpoint(run_dir, step)
    (tmp / "actor").mkdir()
    (tmp / "actor" / ".metadata").write_bytes(pickle.dumps(Metadata(state_dict_metadata={})))
    return commit_checkpoint(tmp, {"version": STATE_VERSION, "global_step": step}, keep_last)


def test_commit_prune_and_find_see_only_complete_checkpoints(tmp_path):
    run_dir = tmp_path / "run"
    for step in (1, 2, 3):
        fake_checkpoint(run_dir, step, keep_last=2)
    root = run_dir / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["global_step_2", "global_step_3"]
    unfinished = begin_checkpoint(run_dir, 4)  # a save that never completes
    assert find_checkpoint(run_dir) == root / "global_step_3" == find_checkpoint(root)
    assert actor_checkpoint_path(find_checkpoint(root / "global_step_2")) == str(root / "global_step_2" / "actor")
    with pytest.raises(CheckpointNotFoundError, match="unfinished checkpoint"):
        find_checkpoint(unfinished)
    fake_checkpoint(run_dir, 4)  # the next save clears the leftover
    assert sorted(p.name for p in root.iterdir()) == ["global_step_2", "global_step_3", "global_step_4"]


def test_reopening_a_run_keeps_what_it_had(tmp_path, tiny_config):
    cfg = tiny_config()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_config(cfg, run_dir / "config.yaml")
    lines = [{"phase": "sft", "step": 5}, {"phase": "rl", "step": 1}, {"phase": "rl", "step": 2},
             {"phase": "eval", "step": 2}, {"phase": "rl", "step": 3}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    checkpoint = fake_checkpoint(run_dir, 2)
    later = fake_checkpoint(run_dir, 3)  # resumed from the older one: step 3 would be written over
    (later / "mine").write_text("a user's file")
    longer = tiny_config("trainer.total_steps=9")
    assert reopen_run_dir(resume_config(checkpoint, longer), checkpoint) == run_dir.resolve()
    kept = run_dir / "checkpoints" / "global_step_3.before-resume-step2"
    assert (kept / "mine").read_text() == "a user's file" and not later.exists()
    assert complete_checkpoints(run_dir / "checkpoints") == [checkpoint]
    assert read_metrics(run_dir / "metrics.jsonl") == lines[:4]  # step 3 is trained again
    assert read_metrics(run_dir / "metrics.before-resume-step2.jsonl") == lines
    assert load_config(RunConfig, run_dir / "config.yaml").trainer.total_steps == 9
    assert load_config(RunConfig, run_dir / "config.before-resume-step2.yaml") == cfg
    with pytest.raises(ConfigError, match="data.train_batch_size: saved 4, now 8"):
        resume_config(checkpoint, tiny_config("data.train_batch_size=8", "actor.micro_batch.mini_batch_size=8"))


def test_controller_rng_round_trips_through_json():
    state = json.loads(json.dumps(controller_rng_state()))
    want = (random.random(), np.random.rand(), torch.rand(1).item())
    set_controller_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == want


# ----------------------------------------------------------------------------- automatic recovery


@pytest.mark.slow
@pytest.mark.extended  # automatic restart: in make test by test_async_failures.py and tests/cluster
def test_a_worker_killed_mid_run_is_restarted_from_the_checkpoint_with_the_uninterrupted_metrics(
        reference, tiny_config, tmp_path, monkeypatch):
    """Actor rank 1 is SIGKILLed in its second update (step 2, after the step-1 checkpoint):
    the run restarts once, resumes step 1's checkpoint and logs the reference's metrics."""
    _, want = reference
    monkeypatch.setenv("HYBRIDFLOW_FAULT", f"kill:actor.update_actor:1:2:{tmp_path / 'fired'}")
    with RLTrainer(tiny_config(*CASE, f"trainer.total_steps={TOTAL}", "trainer.max_restarts=1")) as trainer:
        result = trainer.train()
    assert result.steps == TOTAL and (tmp_path / "fired").is_file()
    assert_same_steps(result.run_dir, want, [1, 2, 3])
    restarts = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if r["phase"] == "restart"]
    assert len(restarts) == 1
    record = restarts[0]
    assert record["step"] == 1 and record["restart/count"] == 1 and record["restart/failed_step"] == 2
    assert (record["restart/role"], record["restart/rank"], record["restart/cause"]) == ("actor", 1, "died")
    assert record["restart/phase"] == "update_actor" and record["restart/method"] == "actor.update_actor"
