"""SIGTERM / SIGINT stop an environment run cleanly (trainer/run/stop_signal.py, the mechanism of
language-model runs): the iteration in progress finishes, a checkpoint of it is written
(trainer.save_on_signal), the env runners (in-process or Ray actors) are shut down, one line
is printed and the exit status is 128 + the signal; `--resume` continues from the checkpoint.
Real subprocesses and real signals, sent once the run has logged a record."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hybridflow.cli import main
from hybridflow.trainer.run.run_dir import read_metrics
from tests.processes import alive, descendants
from trainer_helpers import logged_rl_steps

ROOT = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
# 8 envs x 32 steps = 256 environment steps an iteration, a record each; never done on its own.
SETTINGS = ["trainer.console=plain", "trainer.target_return=null", "trainer.log_freq=256",
            "trainer.total_env_steps=10000000", "ppo.epochs=2", "trainer.loggers=[jsonl]"]


def _stop_after_progress(args: list[str], run_dir: Path, signum: int,
                         ready: Callable[[int], bool] | None = None) -> tuple[int, str, set[int]]:
    """Start `args`, wait for its first logged record (or until `ready(pid)`), send `signum`;
    (exit status, stderr, the processes below it when the signal went)."""
    ready = ready or (lambda pid: bool(logged_rl_steps(run_dir)))
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    try:
        while not ready(proc.pid):  # the pytest timeout guards a hang
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        processes = descendants(proc.pid)  # Ray and its env runners, when there are any
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    return proc.returncode, err, processes


def _stopped_iteration(err: str, prefix: str, run_dir: Path, signame: str = "SIGTERM") -> int:
    """The iteration the one line names; checks the line and that the run logged up to it."""
    assert "Traceback" not in err and "*** SIGTERM received" not in err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"{prefix}stopped by {signame} after iteration "), err
    iteration = int(line.split("after iteration ")[1].split(";")[0])
    assert f"continue with `hybridflow train --resume {run_dir}`" in line
    assert logged_rl_steps(run_dir)[0] == 1 and logged_rl_steps(run_dir)[-1] <= iteration  # the iteration was finished
    return iteration


def _cli(run_dir: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "hybridflow.cli", "train", "--config", str(ROOT / "examples" / "ppo_cartpole.yaml"),
            f"trainer.run_dir={run_dir}", *SETTINGS, *overrides]


@pytest.mark.timeout(300)
def test_sigterm_in_process_checkpoints_the_iteration_and_resume_continues(tmp_path):
    run_dir = tmp_path / "run"
    code, err, _ = _stop_after_progress(_cli(run_dir), run_dir, signal.SIGTERM)
    assert code == 143, err
    iteration = _stopped_iteration(err, "hybridflow train: ", run_dir)
    checkpoint = run_dir / "checkpoints" / f"global_step_{iteration}"
    assert f"; checkpoint {checkpoint};" in err
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == [checkpoint.name]  # save_freq is 0

    env_steps = 256 * iteration
    assert main(["train", "--resume", str(run_dir), f"trainer.total_env_steps={env_steps + 512}"]) == 0
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "rl"]
    resumed = [r for r in records if r["step"] > iteration]
    # Continued from the checkpoint: the next iterations, their environment steps counted on from it.
    assert [r["step"] for r in resumed] == [iteration + 1, iteration + 2]
    assert [r["env/steps"] for r in resumed] == [env_steps + 256, env_steps + 512]


@pytest.mark.slow  # Ray and an env-runner actor start in ~20-40 s on a 2-core machine
@pytest.mark.timeout(600)
def test_sigterm_with_a_ray_runner_shuts_ray_down_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    code, err, processes = _stop_after_progress(_cli(run_dir, "distributed.num_workers=1"), run_dir, signal.SIGTERM)
    assert code == 143, err
    iteration = _stopped_iteration(err, "hybridflow train: ", run_dir)
    assert (run_dir / "checkpoints" / f"global_step_{iteration}" / "trainer_state.json").is_file()
    assert processes  # Ray's processes and the runner were running
    while alive(processes):  # ... and were shut down (only a hang keeps us here)
        time.sleep(0.2)

    resume = [sys.executable, "-m", "hybridflow.cli", "train", "--resume", str(run_dir),
              f"trainer.total_env_steps={256 * (iteration + 1)}"]
    done = subprocess.run(resume, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=400)
    assert done.returncode == 0, done.stderr
    assert logged_rl_steps(run_dir)[-1] == iteration + 1


def _starting_workers(pid: int) -> bool:
    """A worker actor of the run exists: Ray is up (its handler replaced) and set-up goes on."""
    for child in descendants(pid):
        try:
            if Path(f"/proc/{child}/cmdline").read_bytes().startswith(b"ray::WorkerHost"):
                return True
        except OSError:
            pass
    return False


@pytest.mark.slow  # Ray and the actors start in ~20-40 s on a 2-core machine
@pytest.mark.extended  # a stop signal with Ray runners: test_sigterm_with_a_ray_runner_shuts_ray_down_and_resumes
@pytest.mark.timeout(600)
def test_sigterm_while_ray_workers_start_abandons_the_start_with_143(tmp_path):
    """Ray turns an exception raised by a signal handler while it waits into its own
    SystemExit(1); the stop is still reported as the stop (trainer/entry.py)."""
    run_dir = tmp_path / "run"
    code, err, processes = _stop_after_progress(_cli(run_dir, "distributed.num_workers=1"), run_dir,
                                                signal.SIGTERM, _starting_workers)
    assert code == 143, err
    assert err.strip().splitlines()[-1] == "hybridflow train: stopped by SIGTERM (the step in progress was abandoned)"
    assert "Traceback" not in err and "*** SIGTERM received" not in err
    while alive(processes):  # Ray and the worker were shut down (only a hang keeps us here)
        time.sleep(0.2)


SCRIPT = """
from hybridflow import RLTrainer
RLTrainer({{"algorithm": "PPO", "env": {{"id": "CartPole-v1", "num_envs": 8}}, "ppo.rollout_steps": 32,
            "ppo.epochs": 2, "distributed.num_workers": 0, "trainer.run_dir": {run_dir!r},
            "trainer.log_freq": 256, "trainer.console": "plain", "trainer.loggers": ["jsonl"],
            "trainer.total_env_steps": 10000000, "trainer.save_on_signal": False}}).train()
"""


@pytest.mark.timeout(300)
def test_sigint_ends_a_script_using_rltrainer_with_one_line_and_130(tmp_path):
    """A user's script that lets RunTerminated through: exit status 128 + SIGINT, the one line
    (printed at exit) instead of a traceback; with save_on_signal false no checkpoint is made."""
    run_dir = tmp_path / "run"
    args = [sys.executable, "-c", SCRIPT.format(run_dir=str(run_dir))]
    code, err, _ = _stop_after_progress(args, run_dir, signal.SIGINT)
    assert code == 130, err
    _stopped_iteration(err, "hybridflow: ", run_dir, "SIGINT")
    assert "; no checkpoint yet;" in err
    assert not (run_dir / "checkpoints").exists() or not any((run_dir / "checkpoints").iterdir())
