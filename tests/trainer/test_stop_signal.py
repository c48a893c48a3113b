"""SIGTERM stops `hybridflow train` cleanly (trainer/run/stop_signal.py): the step in progress
finishes, a checkpoint of it is written (trainer.save_on_signal), the workers and Ray are
shut down, one line is printed and the exit status is 143. A real subprocess, a real signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import alive, descendants
from trainer_helpers import TINY, logged_rl_steps

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a tiny run's start (Ray, two ranks) takes 30-60 s on a 2-core machine
@pytest.mark.timeout(600)
def test_sigterm_finishes_the_step_checkpoints_it_and_exits_143(tmp_path):
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "hybridflow.cli", "train", *TINY, f"trainer.run_dir={run_dir}",
            "trainer.total_steps=500", "trainer.save_freq=0", "trainer.loggers=[jsonl]", "trainer.val_before_train=false"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        while not logged_rl_steps(run_dir):  # the run is stepping (the pytest timeout guards a hang)
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.5)
        processes = descendants(proc.pid)  # Ray, its workers, the reward workers
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("hybridflow train: stopped by SIGTERM after step "), err
    step = int(line.split("after step ")[1].split(";")[0])
    assert f"checkpoint {run_dir / 'checkpoints' / f'global_step_{step}'};" in line and "--resume" in line
    assert (run_dir / "checkpoints" / f"global_step_{step}" / "trainer_state.json").is_file()
    assert logged_rl_steps(run_dir) == list(range(1, step + 1))  # the step was finished, not cut
    assert "Traceback" not in err and "*** SIGTERM received" not in err
    while alive(processes):  # the workers were shut down (only a hang keeps us here)
        time.sleep(0.2)


@pytest.fixture
def stop():
    """A fresh StopSignal installed in this process; the previous handlers come back after."""
    from hybridflow.trainer.run.stop_signal import SIGNALS, StopSignal

    before = {signum: signal.getsignal(signum) for signum in SIGNALS}
    handler = StopSignal()
    handler.install()
    yield handler
    for signum, previous in before.items():
        signal.signal(signum, previous)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_first_signal_lets_the_step_finish_and_a_second_abandons_it(stop, signum):
    from hybridflow.trainer.run.stop_signal import RunTerminated

    with stop.deferred():
        os.kill(os.getpid(), signum)
        time.sleep(0.01)  # the handler runs between bytecodes of the main thread
        assert stop.received and stop.exit_status == 128 + signum  # recorded, nothing raised
        with pytest.raises(RunTerminated, match=f"stopped by {signal.Signals(signum).name} .*abandoned") as raised:
            os.kill(os.getpid(), signal.SIGTERM)  # a second signal, of either kind
            time.sleep(1)
    assert raised.value.code == 128 + signum and not isinstance(raised.value, Exception)  # `except Exception` lets it by
    assert raised.value.reported().startswith("stopped by")  # reported: nothing is printed at exit


def test_outside_the_steps_sigterm_abandons_and_sigint_is_keyboard_interrupt(stop):
    from hybridflow.trainer.run.stop_signal import RunTerminated

    with pytest.raises(RunTerminated) as raised:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
    raised.value.reported()
    with pytest.raises(KeyboardInterrupt):
        with stop.deferred():  # a new train() call starts afresh ...
            assert not stop.received
        os.kill(os.getpid(), signal.SIGINT)  # ... and after it Ctrl-C is what it is in any program
        time.sleep(1)
