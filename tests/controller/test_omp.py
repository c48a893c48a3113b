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


def test_the_default_is_a_short_spin_and_is_saved_in_config_yaml(tmp_path):
    from hybridflow.trainer.run.run_dir import create_run_dir

    cfg = resolve_run_config(load_run_config(None, [f"trainer.run_dir={tmp_path / 'run'}"]))
    assert cfg.resources.omp_wait_policy == "short_spin"
    saved = yaml.safe_load((create_run_dir(cfg) / "config.yaml").read_text())
    assert saved["resources"]["omp_wait_policy"] == "short_spin"
    assert "passive wait" in omp.describe("passive") and "short spin (1000 turns)" in omp.describe("short_spin")


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
        assert printed.count("OpenMP threads: short spin") == 1
        assert omp.worker_env() == {"GOMP_SPINCOUNT": "1000"}  # what the reward pool and workers start with
        saved = yaml.safe_load((ctx.run_dir / "config.yaml").read_text())
        assert saved["resources"]["omp_wait_policy"] == "short_spin"
    finally:
        ctx.close()
