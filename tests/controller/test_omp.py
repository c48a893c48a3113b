"""resources.omp_wait_policy (controller/omp.py): the wait policy a run resolves, prints and
saves, the environment a worker actor gets, and that torch's OpenMP runtime reads it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from hybridflow.config import ConfigError
from hybridflow.config.schema import load_run_config, resolve_run_config
from hybridflow.controller import Dispatch, ResourcePool, Worker, WorkerGroup, omp, register


@pytest.fixture
def clean_env(monkeypatch):
    """The test's changes to the OpenMP variables are undone afterwards."""
    for name in omp.VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(omp, "_STARTING_ENV", dict.fromkeys(omp.VARIABLES))
    yield
    for name in omp.VARIABLES:
        os.environ.pop(name, None)


class EnvProbe(Worker):
    @register(dispatch=Dispatch.ONE_TO_ALL)
    def openmp(self) -> dict:
        import torch

        return {"env": {k: os.environ.get(k) for k in omp.VARIABLES}, "threads": torch.get_num_threads()}


def test_the_default_auto_is_resolved_and_the_choice_saved_in_config_yaml(tmp_path):
    from hybridflow.trainer.run.run_dir import create_run_dir

    assert load_run_config(None, []).resources.omp_wait_policy == "auto"
    cfg = resolve_run_config(load_run_config(None, [f"trainer.run_dir={tmp_path / 'run'}"]))
    assert cfg.resources.omp_wait_policy == omp.last_auto().policy in ("passive", "inherit")
    saved = yaml.safe_load((create_run_dir(cfg) / "config.yaml").read_text())
    assert saved["resources"]["omp_wait_policy"] == cfg.resources.omp_wait_policy
    assert "passive wait" in omp.describe("passive") and "short spin (1000 turns)" in omp.describe("short_spin")


def test_auto_waits_passively_only_where_other_work_shares_the_cores():
    quiet = omp.choose_auto(lambda: (0.1, 2))
    assert quiet.policy == "inherit" and "0.1 of 2 cores" in quiet.reason
    assert omp.choose_auto(lambda: (1.6, 2)).policy == "passive"
    assert omp.choose_auto(lambda: (None, 2)).policy == "inherit"  # no /proc/stat: the runtime's own
    assert omp.resolve("short_spin", measure=lambda: pytest.fail("only auto measures")) == "short_spin"
    assert omp.resolve("auto", measure=lambda: (1.0, 2)) == "passive" and omp.last_auto().busy_cores == 1.0


def test_a_shared_machine_gives_a_run_the_cores_left_free_where_threads_are_the_runs_choice(monkeypatch):
    from hybridflow.config.sections.resources import local_cores

    cores = local_cores()
    monkeypatch.setattr(omp, "busy_cores", lambda: (cores - 0.7, cores))  # other work leaves 0.7 of a core
    monkeypatch.setattr(omp, "_last_auto", None)  # measure now, not a reading from earlier in this process
    shared = resolve_run_config(load_run_config(None, [])).resources
    assert (shared.omp_wait_policy, shared.threads_per_rank) == ("passive", 1)
    assert "so passive" in omp.last_auto().reason
    # a thread count the user set, or a policy the user chose, is kept
    pinned = resolve_run_config(load_run_config(None, [f"resources.threads_per_rank={cores}"])).resources
    assert (pinned.omp_wait_policy, pinned.threads_per_rank) == ("passive", cores)
    chosen = resolve_run_config(load_run_config(None, ["resources.omp_wait_policy=passive"])).resources
    assert chosen.threads_per_rank == cores
    # the free cores split over the ranks, at least one thread each
    assert omp.AutoChoice("passive", 0.6, 8).free_core_threads(2) == 4
    assert omp.AutoChoice("passive", 7.9, 8).free_core_threads(2) == 1
    assert "and 3 torch threads per rank" in omp.AutoChoice("passive", 1.0, 4, threads=3).reason


def test_busy_cores_sees_a_process_spinning_beside_it():
    # A real competitor: a child process spinning on one of this process's cores.
    cpu = min(os.sched_getaffinity(0))
    spin = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    try:
        import time

        time.sleep(0.5)  # past its interpreter's start
        busy, cores = omp.busy_cores(seconds=0.5)
    finally:
        spin.kill()
        spin.wait()
    assert cores == len(os.sched_getaffinity(0))
    assert busy is not None and busy >= omp.AUTO_BUSY_CORES  # it alone keeps one core busy


def test_a_bad_policy_names_its_key():
    with pytest.raises(ConfigError, match=r"resources\.omp_wait_policy: 'spin' is not one of"):
        load_run_config(None, ["resources.omp_wait_policy=spin"])


def test_inherit_restores_what_the_environment_had(clean_env, monkeypatch):
    monkeypatch.setattr(omp, "_STARTING_ENV", {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": None})
    omp.export_policy("passive")
    assert omp.worker_env() == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"}
    omp.export_policy("inherit")
    assert omp.worker_env() == {"OMP_WAIT_POLICY": "ACTIVE"}
    assert "OMP_WAIT_POLICY=ACTIVE" in omp.describe("inherit")


def test_torchs_openmp_runtime_reads_the_passive_policy(clean_env):
    # OMP_DISPLAY_ENV makes GNU (and LLVM) OpenMP print the values it took when it loaded.
    env = {**os.environ, **omp.policy_env("passive"), "OMP_DISPLAY_ENV": "TRUE"}
    out = subprocess.run([sys.executable, "-c", "import torch; torch.ones(4).sum()"], env=env,
                         capture_output=True, text=True, check=True)
    if "OPENMP DISPLAY ENVIRONMENT" not in out.stderr:
        pytest.skip("this torch's OpenMP runtime does not display its settings")
    assert "OMP_WAIT_POLICY = 'PASSIVE'" in out.stderr


def test_a_worker_actor_gets_the_controllers_policy(ray_local, clean_env):
    # The session's Ray started before this test set the policy: the worker gets it
    # through its runtime environment, as on a joined cluster.
    omp.export_policy("passive")
    pool = ResourcePool([1], cpus_per_slot=2)
    group = WorkerGroup(pool, EnvProbe)
    try:
        (seen,) = group.openmp()
    finally:
        group.shutdown()
        pool.release()
    assert seen["env"] == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"}
    assert seen["threads"] == 2  # its CPU share (host.py), not the machine's cores


def test_a_run_prints_its_policy_once_and_exports_it_before_its_processes_start(ray_local, clean_env, tmp_path,
                                                                                capsys):
    from hybridflow.trainer.run.setup import RunContext

    cfg = load_run_config(None, [f"trainer.output_dir={tmp_path}", "trainer.console=plain", "sft.steps=0"])
    ctx = RunContext.open(cfg)
    try:
        printed = capsys.readouterr().out
        chosen = omp.last_auto()
        assert printed.count("OpenMP threads:") == 1 and printed.count(chosen.reason) == 1
        # what the reward pool and workers start with
        assert omp.worker_env() == ({"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"}
                                    if chosen.policy == "passive" else {})
        saved = yaml.safe_load((ctx.run_dir / "config.yaml").read_text())
        assert saved["resources"]["omp_wait_policy"] == chosen.policy
    finally:
        ctx.close()


def test_a_set_policy_is_exported_as_set(ray_local, clean_env, tmp_path, capsys):
    from hybridflow.trainer.run.setup import RunContext

    cfg = load_run_config(None, [f"trainer.output_dir={tmp_path}", "trainer.console=plain", "sft.steps=0",
                                 "resources.omp_wait_policy=short_spin"])
    ctx = RunContext.open(cfg)
    try:
        assert capsys.readouterr().out.count("OpenMP threads: short spin (1000 turns) then sleep") == 1
        assert omp.worker_env() == {"GOMP_SPINCOUNT": "1000"}
    finally:
        ctx.close()
