"""Runs on a real two-node Ray cluster (conftest.py: two network namespaces on a bridge,
`ray start` in each as docs/resilience.md says), started with no network variable set:
GRPO with a rank on each node, PPO with the actor on one node and the critic on the other,
one_step_off with training on the head and the rollout pool on the other node (the weight
bridge crosses the network), environment PPO with its runners spread, and `hybridflow eval`
/ `export` of the GRPO run. Each computes what the same run computes on one machine.

    sudo .venv/bin/python -m pytest -q tests/cluster -m slow
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_helpers import (
    HYBRIDFLOW,
    REPO,
    TWO_NODES,
    check_ok,
    cluster_train,
    comparable,
    grpo,
    json_report,
    local_train,
    reward_file,
    rl_records,
    workers_by_role,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

HEAD, OTHER = "10.77.0.1", "10.77.0.2"


@pytest.fixture(scope="module")
def grpo_run(cluster, tmp_path_factory):
    """GRPO, 2 steps, one rank on each node (compared with conftest.py's `grpo_reference`)."""
    root = tmp_path_factory.mktemp("grpo")
    cluster.heal()
    return root, check_ok(cluster_train(cluster, root / "cluster", *grpo(root), *TWO_NODES))


def test_grpo_trains_across_both_nodes_as_on_one_machine(grpo_run, grpo_reference):
    root, text = grpo_run
    assert workers_by_role(root / "cluster")["actor"] == [(0, HEAD, "eth0"), (1, OTHER, "eth0")]
    # The interface each node's collectives use was found from its Ray node IP, and said once.
    assert text.count(f"network: node {HEAD} runs collectives on eth0") == 1
    assert text.count(f"network: node {OTHER} runs collectives on eth0") == 1
    cluster_records, local_records = rl_records(root / "cluster"), rl_records(grpo_reference)
    assert [r["step"] for r in cluster_records] == [1, 2]
    assert cluster_records[-1]["actor/pg_loss"] != 0.0  # the reward tells responses apart: updates train
    assert [comparable(r) for r in cluster_records] == [comparable(r) for r in local_records]


@pytest.mark.extended
def test_eval_and_export_of_the_cluster_run(grpo_run, cluster):
    root, _ = grpo_run
    run = root / "cluster"
    # --use-run-reward: the run's own reward file, which eval runs only when told (docs/robustness.md)
    evaluated = check_ok(cluster.run(0, [HYBRIDFLOW, "eval", str(run), "--use-run-reward", "--max-samples", "4",
                                         "--output", str(root / "eval.json")], cwd=REPO, timeout=600))
    assert (root / "eval.json").is_file() and "accuracy" in evaluated
    check_ok(cluster.run(0, [HYBRIDFLOW, "export", str(run), "--out", str(root / "exported")], cwd=REPO, timeout=600))
    assert (root / "exported" / "config.json").is_file()
    assert list((root / "exported").glob("*.safetensors"))


@pytest.mark.extended
def test_ppo_split_puts_the_actor_and_the_critic_on_different_nodes(cluster, tmp_path):
    common = ["algorithm.name=ppo", "trainer.total_steps=2", "resources.placement=split", "resources.critic_ranks=1",
              f"reward.custom_fn_path={reward_file(tmp_path)}"]
    cluster.heal()
    check_ok(cluster_train(cluster, tmp_path / "cluster", *common, *TWO_NODES))
    check_ok(local_train(tmp_path / "local", *common, "resources.world_size=2"))
    assert workers_by_role(tmp_path / "cluster") == {"actor": [(0, HEAD, "eth0")], "critic": [(0, OTHER, "eth0")]}
    assert [comparable(r) for r in rl_records(tmp_path / "cluster")] == \
        [comparable(r) for r in rl_records(tmp_path / "local")]


def test_one_step_off_sends_the_weights_across_the_network(cluster, tmp_path):
    """Two training ranks fill the head (2 CPUs), so the rollout pool lands on the other node."""
    common = ["algorithm.name=grpo", "trainer.total_steps=2", "trainer.mode=one_step_off", "async_rl.rollout_ranks=1",
              f"reward.custom_fn_path={reward_file(tmp_path)}"]
    cluster.heal()
    check_ok(cluster_train(cluster, tmp_path / "cluster", *common, "resources.nodes=1", "resources.ranks_per_node=2"))
    check_ok(local_train(tmp_path / "local", *common, "resources.world_size=2"))
    roles = workers_by_role(tmp_path / "cluster")
    assert roles["actor"] == [(0, HEAD, "eth0"), (1, HEAD, "eth0")] and roles["rollout"] == [(0, OTHER, "eth0")]
    records = rl_records(tmp_path / "cluster")
    assert all(r["weight_sync/bytes"] > 0 for r in records)
    assert [comparable(r) for r in records] == [comparable(r) for r in rl_records(tmp_path / "local")]


def test_worker_processes_listen_on_their_node_address_only(cluster):
    """Gloo, the group's rendezvous store and the weight bridge's store and group: bound to
    the node's address (found from its Ray node IP), never to every interface."""
    cluster.heal()
    report = json_report(cluster.run(0, [sys.executable, str(Path(__file__).with_name("listeners_scenario.py")),
                                         cluster.address], cwd=REPO, timeout=600))
    assert report["bridge_host"] == HEAD
    for rank, node in enumerate((HEAD, OTHER)):
        got = report["ranks"][rank]
        assert got["node"] == node and got["sum"] == 2.0
        assert got["env"] == {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"}
        # gloo's and the stores' listeners: not 0.0.0.0, ::, or the hostname's 127.0.0.1
        assert got["listening"] == [node], got["listening"]
    assert report["ranks"][1]["received"] == [[0.0, 1.0, 2.0, 3.0]]


@pytest.mark.extended
def test_environment_ppo_spreads_its_runners_over_the_nodes(cluster, tmp_path):
    """Two env runners with placement_strategy spread: one on each node (each records where its
    environments were built), the learner's numbers those of the same run on one machine."""
    common = ["--config", str(REPO / "examples" / "ppo_cartpole.yaml"), "env.id=tests.cluster.node_env:NodeCartPole",
              "distributed.num_workers=2", "distributed.placement_strategy=spread", "trainer.total_env_steps=1024",
              "trainer.target_return=null", "trainer.log_freq=512", "trainer.console=plain", "ppo.epochs=2"]
    cluster.heal()
    record = tmp_path / "cluster-envs.txt"
    proc = cluster.popen(0, [HYBRIDFLOW, "train", *common, f"env.kwargs={{record: {record}}}",
                             f"trainer.run_dir={tmp_path / 'cluster'}", f"distributed.ray_address={cluster.address}"],
                         env={"PYTHONPATH": str(REPO)}, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    out, _ = proc.communicate(timeout=600)  # PYTHONPATH: the controller imports the env class; runners get it by value
    assert proc.returncode == 0, out[-6000:]
    check_ok(subprocess.run([HYBRIDFLOW, "train", *common, f"env.kwargs={{record: {tmp_path / 'local-envs.txt'}}}",
                             f"trainer.run_dir={tmp_path / 'local'}"], capture_output=True, text=True, cwd=REPO,
                            timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)}))
    built = [line.split() for line in record.read_text().splitlines()]
    assert {node for node, pid in built if int(pid) != proc.pid} == {HEAD, OTHER}  # the runners, not the controller
    assert [comparable(r) for r in rl_records(tmp_path / "cluster")] == \
        [comparable(r) for r in rl_records(tmp_path / "local")]
