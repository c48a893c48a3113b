"""A crash in either pool of the asynchronous trainer stops the run with a clear error.

The process of one rank is killed between steps; the next `train` call must raise a
WorkerError that names the dead role (pytest's timeout would catch a hang)."""

from __future__ import annotations

import os
import signal

import pytest

from hybridflow import RLTrainer
from hybridflow.controller import WorkerError
from hybridflow.trainer.run.run_dir import read_metrics

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("victim", ["rollout", pytest.param("actor", marks=pytest.mark.extended)])
def test_a_dead_pool_stops_the_run(tiny_config, ray_local, victim):
    cfg = tiny_config("resources.world_size=1", "async_rl.rollout_ranks=1", "trainer.val_before_train=false",
                      "trainer.mode=one_step_off")
    with RLTrainer(cfg) as trainer:
        trainer.train(steps=1)  # generation of the next batch and a weight sync are now queued
        os.kill(trainer.groups[victim].worker_info[0]["pid"], signal.SIGKILL)
        with pytest.raises(WorkerError) as err:
            trainer.train(steps=2)
    assert err.value.role == victim and err.value.died
    assert f"the {victim} pool's rank 0" in str(err.value) and "died" in str(err.value)


def test_a_dead_rollout_pool_is_restarted_from_the_checkpoint(tiny_config, ray_local):
    """With checkpoints, trainer.max_restarts applies to the asynchronous modes too: both
    pools are torn down and the run resumes from the newest checkpoint (async_trainer's
    saved version, seeds' call count and requeued prompts)."""
    from trainer_helpers import rl_records

    cfg = tiny_config("resources.world_size=1", "async_rl.rollout_ranks=1", "trainer.val_before_train=false",
                      "trainer.mode=async", "async_rl.max_staleness=2", "async_rl.chunk_prompts=2",
                      "trainer.save_freq=1", "trainer.max_restarts=1", "trainer.total_steps=4")
    with RLTrainer(cfg) as trainer:
        trainer.train(steps=1)
        os.kill(trainer.groups["rollout"].worker_info[0]["pid"], signal.SIGKILL)
        # groups already generated may carry the next step; the first one that needs the
        # dead pool fails, and the run restarts from the checkpoint before it
        trainer.train(steps=3)
        assert trainer.global_step == 4 and trainer.async_runner.version == 4
        run_dir = trainer.run_dir
    restarts = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "restart"]
    assert [(r["restart/cause"], r["restart/role"]) for r in restarts] == [("died", "rollout")], restarts
    assert restarts[0]["restart/resumed_step"] == restarts[0]["restart/failed_step"] - 1
    assert sorted({r["step"] for r in rl_records(run_dir)}) == [1, 2, 3, 4]


FAILING_PROGRAM = '''
from hybridflow.config.algorithm import AlgorithmSpec, register_algorithm
from hybridflow.trainer.programs.algorithms import generate_and_score, train_critic_free


class ProgramBug(ValueError):
    """The user's own error type: the trainer must hand it back as it is."""


@register_algorithm(AlgorithmSpec(name="fails_at_step_2", estimators=("grpo",), min_samples=2))
def fails_at_step_2(step, roles, cfg, state):
    generate_and_score(step, roles, cfg)
    if step.index == 2:
        raise ProgramBug("the program's own bug at step 2")
    train_critic_free(step, roles, cfg, state)
'''


@pytest.fixture(scope="module")
def failing_program(tmp_path_factory):
    """The file of FAILING_PROGRAM (one file: its algorithm is registered once per process)."""
    path = tmp_path_factory.mktemp("program") / "fails.py"
    path.write_text(FAILING_PROGRAM, encoding="utf-8")
    return path


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_error_of_the_program_itself_is_raised_as_in_sync_mode_and_not_retried(tiny_config, ray_local,
                                                                                  failing_program, mode):
    """A user's program that raises (a bug in its own code, no worker failed) stops the run
    with its own exception in every mode, as the controller's own errors do: the asynchronous
    modes run it in a task beside the pools, whose failure must not pass for a worker's and
    be retried by trainer.max_restarts from the checkpoint."""
    cfg = tiny_config("resources.world_size=1", "async_rl.rollout_ranks=1", "trainer.val_before_train=false",
                      f"trainer.mode={mode}", "algorithm.name=fails_at_step_2",
                      f"algorithm.module={failing_program}", "trainer.save_freq=1", "trainer.max_restarts=1")
    with RLTrainer(cfg) as trainer:
        with pytest.raises(ValueError, match="the program's own bug at step 2") as err:
            trainer.train(steps=2)
        run_dir = trainer.run_dir
    assert type(err.value).__name__ == "ProgramBug" and not isinstance(err.value, WorkerError)
    assert [r["phase"] for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "restart"] == []


CRASHING_PROGRAM = '''
import os
from pathlib import Path

from hybridflow.config.algorithm import AlgorithmSpec, register_algorithm
from hybridflow.trainer.programs.algorithms import generate_and_score, train_critic_free

MARK = Path({mark!r})


@register_algorithm(AlgorithmSpec(name="crashes_after_update", estimators=("grpo",), min_samples=2))
def crashes_after_update(step, roles, cfg, state):
    generate_and_score(step, roles, cfg)
    train_critic_free(step, roles, cfg, state)
    if step.index == 2 and not MARK.exists():  # the first run of step 2 only
        MARK.write_text("updated", encoding="utf-8")
        os._exit(1)  # the process running the program dies after the actor's update
'''


def test_a_step_task_whose_process_dies_is_a_failure_not_run_again(tiny_config, ray_local, tmp_path):
    """The asynchronous modes run a step's program in a Ray task; when its process dies after
    the actor's update, running the task again (Ray's default for tasks) would update the
    actor a second time on the same batch, silently. It is a failure of the step (restarted
    from the checkpoint with trainer.max_restarts, here stopping the run)."""
    (tmp_path / "crashes.py").write_text(CRASHING_PROGRAM.format(mark=str(tmp_path / "mark")), encoding="utf-8")
    cfg = tiny_config("resources.world_size=1", "async_rl.rollout_ranks=1", "trainer.val_before_train=false",
                      "trainer.mode=one_step_off", "algorithm.name=crashes_after_update",
                      f"algorithm.module={tmp_path / 'crashes.py'}")
    with RLTrainer(cfg) as trainer:
        with pytest.raises(WorkerError, match="step_program"):
            trainer.train(steps=2)
    assert (tmp_path / "mark").is_file()
