"""Limits on reward code: a memory cap per worker, a bounded cost for a function that
crashes or hangs on every sample, a run stopped after too many failing steps in a row,
and workers that exit with the controller."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from hybridflow.rewards import RewardConfig, RewardManager, load_reward_fn
from hybridflow.rewards.manager import RewardFailureError
from hybridflow.rewards.pool import MAX_RESTARTS_PER_RUN
from tests.processes import alive, descendants
from test_reward_manager import make_batch, tokenizer  # noqa: F401 - the fixture

REWARD_FILE = textwrap.dedent(
    '''
    import os, signal, time

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if ground_truth == "greedy":
            block = bytearray(2 * 1024 ** 3)  # 2 GiB, over the workers' limit
            return float(len(block))
        if ground_truth == "crash":
            os._exit(3)
        if ground_truth == "raise":
            raise RuntimeError("bad sample")
        return float(solution_str == ground_truth)
    '''
)


@pytest.fixture(scope="module")
def reward_fn(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward") / "limits_reward.py"
    path.write_text(REWARD_FILE)
    return load_reward_fn(path, "compute_score")


def test_a_worker_cannot_allocate_past_its_memory_limit(tokenizer, reward_fn):
    config = RewardConfig(num_workers=1, timeout_s=5.0, memory_limit_mb=512, max_failed_steps=0)
    with RewardManager(tokenizer, config, reward_fn) as manager:
        out = manager(make_batch(tokenizer, ["1", "2"], ["greedy", "2"]))
    assert out.scores.tolist() == [0.0, 1.0]
    assert "MemoryError" in dict(out.errors)[0]


def test_a_function_that_kills_every_worker_costs_a_bounded_number_of_restarts(tokenizer, reward_fn):
    config = RewardConfig(num_workers=2, timeout_s=5.0, max_failed_steps=0)
    with RewardManager(tokenizer, config, reward_fn) as manager:
        out = manager(make_batch(tokenizer, [str(i) for i in range(40)], ["crash"] * 40))
    assert out.metrics["reward/worker_restarts"] == MAX_RESTARTS_PER_RUN  # not one per sample
    assert len(out.errors) == 40 and "given up" in out.errors[-1][1]


def test_the_run_stops_after_too_many_failing_steps_in_a_row(tokenizer, reward_fn):
    config = RewardConfig(num_workers=0, timeout_s=5.0, max_failed_share=0.5, max_failed_steps=2)
    manager = RewardManager(tokenizer, config, reward_fn)
    failing = make_batch(tokenizer, ["1", "2", "3"], ["raise", "raise", "3"])  # 2 of 3 fail
    fine = make_batch(tokenizer, ["1", "2", "3"], ["raise", "2", "3"])  # 1 of 3: under the share
    manager(failing)
    manager(fine)  # resets the count: only failing steps in a row stop the run
    manager(failing)
    with pytest.raises(RewardFailureError, match=r"failed on 2 of 3 samples.*last 2 steps.*RuntimeError: bad sample"):
        manager(failing)


def test_config_of_the_limits_is_checked():
    with pytest.raises(ValueError, match="max_failed_share"):
        RewardConfig(max_failed_share=1.0)
    with pytest.raises(ValueError, match="memory_limit_mb"):
        RewardConfig(memory_limit_mb=1)


OWNER = textwrap.dedent(
    '''
    import sys, time
    from hybridflow.data import build_char_tokenizer
    from hybridflow.rewards import RewardConfig, RewardManager, load_reward_fn
    from test_reward_manager import make_batch

    if __name__ == "__main__":
        tokenizer = build_char_tokenizer()
        manager = RewardManager(tokenizer, RewardConfig(num_workers=2, timeout_s=5.0),
                                load_reward_fn(sys.argv[1], "compute_score"))
        out = manager(make_batch(tokenizer, ["1", "2", "3", "4"], ["1", "2", "3", "4"]))
        print("scored", flush=True)
        time.sleep(600)
    '''
)


@pytest.mark.timeout(300)
def test_reward_workers_die_with_a_killed_controller(reward_fn, tmp_path):
    # The mechanism, not a time: each worker's watch thread reports that the controller is
    # gone and exits; the forkserver and resource tracker follow their closed pipes. The
    # pytest timeout only guards against a hang (a worker that never notices).
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), *sys.path])}
    proc = subprocess.Popen([sys.executable, str(script), str(reward_fn.path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "scored"
        processes = descendants(proc.pid)
        assert len(processes) >= 3  # the forkserver, 2 workers (and the resource tracker)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        exited = set()
        for line in proc.stderr:  # the workers inherited the controller's stderr
            match = re.fullmatch(rf"hybridflow reward worker (\d+): the controller \(pid {proc.pid}\) is gone; "
                                 r"exiting", line.strip())
            if match:
                exited.add(int(match.group(1)))
            if len(exited) == 2:
                break
        assert len(exited) == 2 and exited <= processes, (exited, processes)
        while alive(processes):  # they exit right after the line; only a hang could keep us here
            time.sleep(0.1)
    finally:
        proc.kill()
