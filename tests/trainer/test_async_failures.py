"""A crash in either pool of the asynchronous trainer stops the run with a clear error.

The process of one rank is killed between steps; the next `train` call must raise a
WorkerError that names the dead role (pytest's timeout would catch a hang)."""

from __future__ import annotations

import os
import signal

import pytest

from hybridflow import RLTrainer
from hybridflow.controller import WorkerError

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("victim", ["rollout", "actor"])
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
