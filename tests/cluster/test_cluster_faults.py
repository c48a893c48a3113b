"""Faults on a real two-node cluster (conftest.py): the second node is lost (every process of
it killed at once) while a rank of it generates, updates the actor, writes a checkpoint, while
the controller scores rewards, and during the SFT warm start; a slow link (50 ms each way,
100 Mbit/s) for a whole run; the cable unplugged for 20 s mid-step on that link. Each run ends
in a restart from the newest checkpoint (elastic: resources.min_world_size=1) or, where nothing
was saved yet, in one line that names the node and what to do; never a traceback on the
console, never a hang past trainer.call_timeout_s (the run's own limit; pytest's timeout is the
backstop), never a lost checkpoint.

The rank on the lost node is first held in the call (HYBRIDFLOW_FAULT=hang:..., controller/
faults.py) so that the loss happens in that phase, not before or after it.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from cluster_helpers import (
    HYBRIDFLOW,
    REPO,
    TINY,
    TWO_NODES,
    comparable,
    console,
    grpo,
    no_traceback,
    restart_records,
    rl_records,
    when,
)

from hybridflow.trainer.observe.live_status import read_status
from hybridflow.trainer.run.checkpointing import checkpoint_step, complete_checkpoints

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

OTHER = "10.77.0.2"
CALL_TIMEOUT_S = 120  # trainer.call_timeout_s of these runs: a hang past it is a failure of the run
ELASTIC = ["algorithm.name=grpo", "trainer.total_steps=2", "resources.min_world_size=1", "trainer.max_restarts=1",
           f"trainer.call_timeout_s={CALL_TIMEOUT_S}", *TWO_NODES]


def start_train(cluster, run_dir: Path, *overrides: str, fault: str | None = None) -> subprocess.Popen:
    env = {"HYBRIDFLOW_FAULT": fault} if fault else None
    return cluster.popen(0, [HYBRIDFLOW, "train", f"resources.ray_address={cluster.address}",
                             f"trainer.run_dir={run_dir}", *TINY, *overrides], env=env, cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, run_dir: Path) -> subprocess.CompletedProcess:
    """The run's end; its console is kept beside the run directory (console.txt)."""
    out, err = proc.communicate(timeout=800)
    (run_dir.parent / "console.txt").write_text(out + err)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def lose_node_when(cluster, fired: Path) -> None:
    """When the held rank has entered its call, the second machine is lost: all its processes
    are killed at once; then it boots again (`ray start`), as a rebooted machine would."""
    def lose() -> None:
        time.sleep(1.0)  # the other rank is now waiting for it in the call's collectives
        cluster.kill_node(1)
        cluster.start_ray(1)

    when(fired.exists, lose)


@pytest.mark.parametrize(("method", "phase"), [
    pytest.param("generate_sequences", "gen", marks=pytest.mark.extended),
    ("update_actor", "update_actor"),
    pytest.param("write_checkpoint", "save_checkpoint", marks=pytest.mark.extended),
])
def test_a_node_lost_in_a_phase_restarts_from_the_newest_checkpoint(healthy, tmp_path, method, phase):
    run_dir, fired = tmp_path / "run", tmp_path / "fired"
    lose_node_when(healthy, fired)
    done = finish(start_train(healthy, run_dir, *ELASTIC, fault=f"hang:actor.{method}:1:2:{fired}"), run_dir)
    text = console(done)
    assert done.returncode == 0, text[-6000:]
    no_traceback(text)
    (restart,) = restart_records(run_dir)
    assert (restart["restart/role"], restart["restart/rank"], restart["restart/node"]) == ("actor", 1, OTHER)
    assert (restart["restart/cause"], restart["restart/phase"]) == ("died", phase)
    assert (restart["restart/failed_step"], restart["restart/resumed_step"]) == (2, 1)
    assert f"node {OTHER}" in text  # the one-line report of the failure
    assert [r["step"] for r in rl_records(run_dir)] == [1, 2]
    # No checkpoint lost: the one restarted from is still there, the failed step's was written again.
    assert [checkpoint_step(c) for c in complete_checkpoints(run_dir / "checkpoints")] == [1, 2]


@pytest.mark.extended
def test_a_node_lost_while_rewards_are_scored_restarts_from_the_newest_checkpoint(healthy, tmp_path):
    """The controller scores rewards itself; the lost rank is found at the next call (old_log_prob)."""
    run_dir, gate = tmp_path / "run", tmp_path / "gate"
    gate.mkdir()
    reward = tmp_path / "gated_reward.py"
    # The first sample of step 2 (8 samples a step) waits in the reward function until the node is lost.
    reward.write_text(f'''
import os, time
GATE = {str(gate)!r}

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    with open(os.path.join(GATE, "calls"), "a") as f:
        f.write("x")
    if os.path.getsize(os.path.join(GATE, "calls")) == 9:
        open(os.path.join(GATE, "entered"), "w").close()
        while not os.path.exists(os.path.join(GATE, "release")) and time.sleep(0.1) is None:
            pass
    return float(sum(map(ord, solution_str)) % 7) / 6.0
''')

    def lose() -> None:
        assert read_status(run_dir)["phase"] == "reward"
        healthy.kill_node(1)
        (gate / "release").touch()
        healthy.start_ray(1)

    when((gate / "entered").exists, lose)
    # The gate writes files: the reward processes run unconfined here.
    done = finish(start_train(healthy, run_dir, *ELASTIC, f"reward.custom_fn_path={reward}",
                              "reward.manager.timeout_s=300", "reward.manager.sandbox=false"), run_dir)
    text = console(done)
    assert done.returncode == 0, text[-6000:]
    no_traceback(text)
    (restart,) = restart_records(run_dir)
    assert (restart["restart/rank"], restart["restart/node"], restart["restart/cause"]) == (1, OTHER, "died")
    assert (restart["restart/failed_step"], restart["restart/resumed_step"]) == (2, 1)
    assert [r["step"] for r in rl_records(run_dir)] == [1, 2]


@pytest.mark.extended
def test_a_node_lost_during_the_sft_warm_start_stops_with_one_line(healthy, tmp_path):
    """Nothing is saved before the warm start ends, so there is nothing to restart from: the run
    stops with one line that names the node and what to do."""
    run_dir, fired = tmp_path / "run", tmp_path / "fired"
    lose_node_when(healthy, fired)
    done = finish(start_train(healthy, run_dir, *ELASTIC, "sft.steps=3", fault=f"hang:actor.update_actor:1:2:{fired}"),
                  run_dir)
    text = console(done)
    assert done.returncode == 1, text[-6000:]
    no_traceback(text)
    (report,) = [line for line in done.stderr.splitlines() if line.startswith("hybridflow train:")]
    assert f"actor rank 1 (node {OTHER}" in report and "during the SFT warm start" in report
    assert "run the same command again" in report and "--resume" not in report  # there is no checkpoint


@pytest.mark.extended
def test_a_slow_link_only_slows_the_run(healthy, tmp_path, grpo_reference):
    """50 ms each way and 100 Mbit/s between the nodes for the whole run, every connection on it
    (the round trip shows it): the run computes what the same run on one machine computes."""
    run_dir = tmp_path / "run"
    with healthy.slowed(1, delay_ms=50, rate_mbit=100):
        assert healthy.round_trip_ms(1) >= 100.0  # each packet is held 50 ms each way: a floor, not a timing
        done = finish(start_train(healthy, run_dir, *grpo(tmp_path), f"trainer.call_timeout_s={CALL_TIMEOUT_S}",
                                  *TWO_NODES), run_dir)
    text = console(done)
    assert done.returncode == 0, text[-6000:]
    no_traceback(text)
    assert not restart_records(run_dir)
    assert [comparable(r) for r in rl_records(run_dir)] == [comparable(r) for r in rl_records(grpo_reference)]


@pytest.mark.extended
def test_a_slow_link_unplugged_for_20_s_mid_step(healthy, tmp_path, grpo_reference):
    """50 ms each way and 100 Mbit/s between the nodes, and the cable out for 20 s from the start of
    step 2: the run waits it out and computes what the undisturbed run on one machine does."""
    common = [*grpo(tmp_path), f"trainer.call_timeout_s={CALL_TIMEOUT_S}", "resources.min_world_size=1"]
    run_dir = tmp_path / "run"
    replugged: list[dict] = []

    def unplug() -> None:
        healthy.link(1, up=False)
        time.sleep(20)
        replugged.append(read_status(run_dir))  # what the run was doing when the cable came back
        healthy.link(1, up=True)

    with healthy.slowed(1, delay_ms=50, rate_mbit=100):
        when(lambda: (read_status(run_dir) or {}).get("step") == 2, unplug)
        done = finish(start_train(healthy, run_dir, *common, *TWO_NODES), run_dir)
    text = console(done)
    assert done.returncode == 0, text[-6000:]
    no_traceback(text)
    (status,) = replugged
    assert status["state"] in ("training", "restarting")  # the run was still in it when the cable came back
    records = rl_records(run_dir)
    if restart_records(run_dir):  # Ray gave the node up while unplugged: restarted from step 1's checkpoint
        assert [r["step"] for r in records] == [1, 2]
    else:  # the connections survived the 20 s: nothing to redo, and nothing computed differently
        assert [comparable(r) for r in records] == [comparable(r) for r in rl_records(grpo_reference)]
