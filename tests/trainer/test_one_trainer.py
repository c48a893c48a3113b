"""One `RLTrainer` for every task kind: two trainers one after the other in one process (the
first releases its Ray workers and placement groups when train() returns), a trainer
used outside `with` continues exactly where its previous train() call stopped, and every
environment algorithm is a declared registry row (capabilities, not name compares)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hybridflow import RLTrainer
from hybridflow.cli import main
from hybridflow.config import ConfigError
from hybridflow.config.algorithm import ALGORITHMS, AlgorithmSpec, add_algorithm, algorithm_spec
from hybridflow.config.env_algorithms import EnvAlgorithm, PolicyDefaults, steps_per_iteration
from hybridflow.config.env_schema import env_config_from_dict
from hybridflow.controller import IN_PROCESS
from hybridflow.trainer.observe.live_status import read_status
from hybridflow.trainer.run.run_dir import read_metrics
from trainer_helpers import counted_reads

TIMING_KEYS = ("timing_s/", "env/steps_per_s", "time")


def _quiet(tmp_path, name: str) -> dict:
    return {"trainer": {"output_dir": str(tmp_path / name), "console": "none", "loggers": ["jsonl"]}}


def test_two_trainers_in_one_process_on_ray(ray_local, tmp_path):
    # The script, shortened: before, the second trainer waited 60 s for the
    # placement group the first one still held, and failed.
    ppo = RLTrainer({"algorithm": "PPO", "env": "CartPole-v1", **_quiet(tmp_path, "ppo"),
                     "ppo": {"rollout_steps": 32, "minibatch_size": 32, "epochs": 1}})
    first = ppo.train(steps=64)
    assert first.env_steps == 64 and ppo.groups == {}  # workers and placement groups released
    sac = RLTrainer({"algorithm": "SAC", "env": "Pendulum-v1", **_quiet(tmp_path, "sac"), "policy.hidden_size": [16],
                     "sac": {"learning_starts": 8, "batch_size": 8}})
    second = sac.train(steps=24)
    assert second.env_steps == 24 and sac.groups == {}
    again = ppo.train(steps=64)  # the first trainer starts its workers again, from where it stopped
    assert again.env_steps == 128
    steps = [r["env/steps"] for r in read_metrics(again.run_dir / "metrics.jsonl") if r["phase"] == "rl"]
    assert steps == sorted(steps) and steps[-1] == 128
    ppo.close()
    sac.close()


def test_train_calls_outside_with_continue_exactly_like_one_call(tmp_path):
    # Released between calls (checkpoint, workers stopped, restarted from it) == kept up.
    config = {"algorithm": "ppo", "env": "CartPole-v1", "distributed.num_workers": 0, "env.num_envs": 2,
              "policy.hidden_size": [16], "ppo": {"rollout_steps": 16, "minibatch_size": 32, "epochs": 2},
              "trainer.log_freq": 32}
    with RLTrainer({**config, **_quiet(tmp_path, "kept")}) as kept:
        kept.train(steps=128)
        want = kept.roles.learner.parameters_digest()[0]
    released = RLTrainer({**config, **_quiet(tmp_path, "released")})
    released.train(steps=64)
    released.train(steps=64)
    with released:
        released.train(steps=32)  # restarts from the second call's checkpoint; stays up in `with`
        got = released.roles.learner.parameters_digest()[0]
    with RLTrainer({**config, **_quiet(tmp_path, "longer")}) as longer:
        longer.train(steps=160)
        want_longer = longer.roles.learner.parameters_digest()[0]
    assert all(np.array_equal(want_longer[k], got[k]) for k in want_longer)
    assert not all(np.array_equal(want[k], got[k]) for k in want)  # it did train on after 128 steps

    def records(run):
        return [{k: v for k, v in r.items() if not k.startswith(TIMING_KEYS)}
                for r in read_metrics(run.run_dir / "metrics.jsonl") if r["phase"] == "rl"]

    assert records(released) == records(longer)


def test_environment_algorithms_are_rows_with_declared_capabilities():
    # One registry: PPO's row runs on both task kinds, SAC's on environments only.
    ppo, sac = algorithm_spec("ppo"), algorithm_spec("sac")
    assert ppo.task_kinds == ("language_model", "environment") and sac.task_kinds == ("environment",)
    ppo, sac = ppo.environment, sac.environment
    assert (ppo.collection, ppo.steps_field, ppo.continuous_actions) == ("rollout", "rollout_steps", False)
    assert (sac.collection, sac.steps_field, sac.continuous_actions) == ("replay", "train_freq", True)
    cfg = env_config_from_dict({"algorithm": "sac", "env": "Pendulum-v1", "env.num_envs": 3, "sac.train_freq": 4,
                                "distributed.num_workers": 2})
    assert steps_per_iteration(cfg) == 2 * 3 * 4
    with pytest.raises(ValueError, match="already registered with program hybridflow.trainer.programs.algorithms:ppo"):
        add_algorithm(AlgorithmSpec("ppo", environment=EnvAlgorithm("ppo", "rollout", PolicyDefaults((8,), "tanh", True),
                                                                     "my_pkg.algo:PROGRAM")))
    with pytest.raises(ConfigError, match="algorithm.name: 'ppo2' is not a registered algorithm; did you mean 'ppo'"):
        env_config_from_dict({"algorithm": "ppo2", "env": "CartPole-v1"})
    with pytest.raises(ConfigError, match="algorithm: 'grpo' runs on language-model tasks only; environment tasks run "
                                          "ppo, sac"):
        env_config_from_dict({"algorithm": "grpo", "env": "CartPole-v1"})


def test_a_registered_environment_algorithm_runs_with_its_declared_section(tmp_path):
    # A user's row: PPO's program under another name, with other network defaults.
    add_algorithm(AlgorithmSpec("probe_ppo", environment=EnvAlgorithm(
        "ppo", "rollout", PolicyDefaults((8,), "relu", False), "hybridflow.trainer.programs.algorithms:PPO")))
    try:
        with RLTrainer({"algorithm": "probe_ppo", "env": "CartPole-v1", "distributed.num_workers": 0,
                        "ppo": {"rollout_steps": 16, "minibatch_size": 16, "epochs": 1},
                        **_quiet(tmp_path, "probe")}) as trainer:
            assert trainer.config.policy.hidden_size == [8] and trainer.config.policy.activation == "relu"
            assert trainer.train(steps=32).env_steps == 32
            assert trainer.roles.learner.resource_pool is IN_PROCESS
    finally:
        ALGORITHMS.pop("probe_ppo")


def test_sac_refuses_discrete_actions_by_its_declared_capability(tmp_path):
    with pytest.raises(ConfigError, match=r"SAC needs continuous \(Box\) actions; 'CartPole-v1' has discrete "
                                          r"actions. Use algorithm: ppo") as info:
        RLTrainer({"algorithm": "sac", "env": "CartPole-v1", **_quiet(tmp_path, "sac")})
    assert info.value.key == "algorithm"


@pytest.mark.parametrize("example", ["grpo_arithmetic.yaml", "ppo_cartpole.yaml"])
def test_the_config_file_is_read_once(example, tmp_path, monkeypatch, capsys):
    path = Path(__file__).resolve().parents[2] / "examples" / example
    reads = counted_reads(monkeypatch, path)
    assert main(["train", "--config", str(path), "--print-config", f"trainer.output_dir={tmp_path}"]) == 0
    assert len(reads) == 1 and "trainer:" in capsys.readouterr().out
    if example == "ppo_cartpole.yaml":  # and RLTrainer reads a path once too
        monkeypatch.chdir(tmp_path)  # its run directory goes to ./runs
        with RLTrainer(path) as trainer:
            assert trainer.kind.name == "environment"
        assert len(reads) == 2


def test_resume_without_config_reads_the_runs_config_once(tmp_path, monkeypatch):
    # `train --resume RUN key=value`: the CLI builds the config from the run's config.yaml and
    # the trainer compares it with the saved one; both from one read of the file.
    config = {"algorithm": "ppo", "env": "CartPole-v1", "distributed.num_workers": 0, "env.num_envs": 2,
              "policy.hidden_size": [16], "ppo": {"rollout_steps": 16, "minibatch_size": 32, "epochs": 1},
              "trainer.total_env_steps": 32, **_quiet(tmp_path, "resume")}
    run_dir = RLTrainer(config).train().run_dir  # outside `with`: released with a checkpoint
    reads = counted_reads(monkeypatch, run_dir / "config.yaml")
    assert main(["train", "--resume", str(run_dir), "trainer.total_env_steps=64"]) == 0
    assert len(reads) == 1
    steps = [r["env/steps"] for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "rl"]
    assert steps[-1] == 64
    with pytest.raises(ConfigError, match="cannot resume .* with a different env.num_envs"):
        RLTrainer(env_config_from_dict({**config, "env.num_envs": 4}), resume=run_dir)


def test_a_language_model_run_outside_with_releases_its_workers_and_continues(ray_local, tiny_config):
    trainer = RLTrainer(tiny_config("algorithm.name=grpo", "trainer.val_before_train=false", "trainer.test_freq=0",
                                    "trainer.total_steps=2"))
    assert trainer.kind.name == "language_model"
    trainer.train(steps=1)
    assert trainer.groups == {} and trainer.roles is None  # released, with a checkpoint of step 1
    status = read_status(trainer.run_dir)  # what `hybridflow monitor` reads: the call ended
    assert (status["state"], status["phase"]) == ("finished", None), status
    assert [p.name for p in (trainer.run_dir / "checkpoints").iterdir()] == ["global_step_1"]
    result = trainer.train(steps=1)  # restarted from it
    trainer.close()
    assert result.steps == 2
    steps = [r["step"] for r in read_metrics(result.run_dir / "metrics.jsonl") if r["phase"] == "rl"]
    assert steps == [1, 2]


def test_an_in_process_run_gives_the_torch_threads_back_when_train_returns(tmp_path):
    # The in-process learner runs on distributed.learner_cpus torch threads; a script that
    # goes on with torch after train() (outside `with`) had them left at 1 until close().
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    config = {"algorithm": "ppo", "env": "CartPole-v1", "distributed.num_workers": 0, "policy.hidden_size": [8],
              "ppo": {"rollout_steps": 32, "minibatch_size": 32, "epochs": 1}, **_quiet(tmp_path, "threads")}
    try:
        trainer = RLTrainer(config)
        trainer.train(steps=32)
        assert torch.get_num_threads() == 2
        with trainer:
            trainer.train(steps=32)
            assert torch.get_num_threads() == 1  # distributed.learner_cpus, while the workers stay up
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


def test_a_finished_run_is_told_so_before_its_workers_start(tmp_path):
    # As LM runs (check_steps_left before setup): with 8 Ray env runners the error came
    # after they had all started.
    config = {"algorithm": "ppo", "env": "CartPole-v1", "distributed.num_workers": 0, "policy.hidden_size": [8],
              "ppo": {"rollout_steps": 32, "minibatch_size": 32, "epochs": 1}, "trainer.total_env_steps": 32,
              **_quiet(tmp_path, "finished")}
    RLTrainer(config).train()
    (run_dir,) = (tmp_path / "finished").iterdir()
    with RLTrainer(resume=run_dir) as again:
        with pytest.raises(ConfigError, match="nothing to train: the run is at environment step 32 and "
                                              "trainer.total_env_steps=32"):
            again.train()
        assert again.groups == {}


BIGGER_AFTER = """
import os, sys
import ray
sys.path.insert(0, {helpers!r})
from hybridflow import RLTrainer
from trainer_helpers import tiny_run_config

cores = os.cpu_count() or 1
quiet = {{"output_dir": {out!r}, "console": "none", "loggers": ["jsonl"]}}
ppo = RLTrainer({{"algorithm": "PPO", "env": "CartPole-v1", "trainer": quiet, "distributed.num_workers": 1,
                 "ppo": {{"rollout_steps": 32, "minibatch_size": 32, "epochs": 1}}}})
ppo.train(steps=32)                       # started the embedded Ray, with the machine's cores
assert ray.cluster_resources()["CPU"] == cores
lm = RLTrainer(tiny_run_config({out!r}, f"resources.threads_per_rank={{cores}}", "trainer.val_before_train=false"))
assert ray.cluster_resources()["CPU"] == 2 * cores  # two ranks of `cores` CPUs: Ray started again, bigger
assert lm.train(steps=1).steps == 1
assert ppo.train(steps=32).env_steps == 64   # the first trainer goes on, on the new Ray
ppo.close()
assert ray.is_initialized()               # the language-model trainer still holds it
lm.close()
assert not ray.is_initialized()
print("ok")
"""


@pytest.mark.slow
def test_a_later_trainer_needing_more_cpus_restarts_the_ray_an_idle_one_started(tmp_path):
    # Before, the language-model trainer was refused: the environment trainer's Ray had too few CPUs.
    script = BIGGER_AFTER.format(helpers=str(Path(__file__).parent), out=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=500)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-4000:]
