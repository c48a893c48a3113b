"""Environment tasks in-process (distributed.num_workers: 0): PPO and SAC returns rise in a
short run, and a resumed run equals the uninterrupted one (weights and records)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from hybridflow.config.env_schema import load_env_config
from hybridflow import RLTrainer
from hybridflow.trainer.run.run_dir import read_metrics

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TIMING_KEYS = ("timing_s/", "env/steps_per_s", "time")


def _records(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "rl"]


def _windows(run_dir: Path) -> list[float]:
    return [r["episode/return_mean_window"] for r in _records(run_dir)]


def test_ppo_cartpole_return_rises(tmp_path):
    cfg = load_env_config(EXAMPLES / "ppo_cartpole.yaml", [
        f"trainer.output_dir={tmp_path}", "trainer.console=none", "trainer.total_env_steps=14336",
        "trainer.log_freq=2048"])
    with RLTrainer(cfg) as trainer:
        result = trainer.train()
    windows = _windows(result.run_dir)
    assert result.env_steps == 14336 and len(windows) == 7
    assert windows[-1] > 150 and windows[-1] > 2 * windows[0], windows  # random play lasts ~20 steps
    assert (result.run_dir / "plots" / "episode_return.png").is_file()


def test_sac_pendulum_return_rises(tmp_path):
    cfg = load_env_config(EXAMPLES / "sac_pendulum.yaml", [
        f"trainer.output_dir={tmp_path}", "trainer.console=none", "trainer.total_env_steps=3000",
        "trainer.log_freq=400", "trainer.return_window=2", "policy.hidden_size=[64,64]", "sac.batch_size=64",
        "sac.lr=0.003", "sac.learning_starts=200", "trainer.target_return=null"])
    with RLTrainer(cfg) as trainer:
        result = trainer.train()
    windows = _windows(result.run_dir)
    # Pendulum returns start near -1200..-1600 (random torques) and rise as the swing-up is learnt.
    assert windows[-1] > windows[0] + 300 and windows[-1] > max(windows[:4]) + 200, windows
    assert _records(result.run_dir)[-1]["sac/alpha"] < 1.0  # the temperature was tuned down


def _resume_equals_uninterrupted(tmp_path: Path, example: str, overrides: list[str], checkpoint_step: int) -> None:
    cfg = load_env_config(EXAMPLES / example, [f"trainer.output_dir={tmp_path / 'a'}", "trainer.console=none",
                                               *overrides])
    with RLTrainer(cfg) as full:
        full.train()
        want = full.roles.learner.parameters_digest()[0]
    copy = tmp_path / "b" / full.run_dir.name  # resuming rewrites the run dir: work on a copy
    shutil.copytree(full.run_dir, copy)
    with RLTrainer(resume=copy / "checkpoints" / f"global_step_{checkpoint_step}") as resumed:
        assert resumed.global_step == checkpoint_step
        resumed.train()
        got = resumed.roles.learner.parameters_digest()[0]
    assert want.keys() == got.keys()
    for name in want:
        assert np.array_equal(want[name], got[name]), name
    strip = [{k: v for k, v in r.items() if not k.startswith(TIMING_KEYS)} for r in _records(full.run_dir)]
    again = [{k: v for k, v in r.items() if not k.startswith(TIMING_KEYS)} for r in _records(copy)]
    assert again == strip and len(strip) > 2


def test_ppo_resume_equals_an_uninterrupted_run(tmp_path):
    _resume_equals_uninterrupted(tmp_path, "ppo_cartpole.yaml", [
        "trainer.total_env_steps=2048", "trainer.save_freq=512", "trainer.log_freq=256",
        "env.normalize_obs=true", "env.normalize_reward=true", "trainer.target_return=null"], checkpoint_step=4)


def test_sac_resume_equals_an_uninterrupted_run(tmp_path):
    _resume_equals_uninterrupted(tmp_path, "sac_pendulum.yaml", [
        "trainer.total_env_steps=400", "trainer.save_freq=200", "trainer.log_freq=50", "sac.learning_starts=100",
        "policy.hidden_size=[32,32]", "sac.batch_size=32", "trainer.target_return=null"], checkpoint_step=200)


def test_resume_refuses_a_changed_algorithm_setting(tmp_path):
    cfg = load_env_config(EXAMPLES / "ppo_cartpole.yaml", [
        f"trainer.output_dir={tmp_path}", "trainer.console=none", "trainer.total_env_steps=512",
        "trainer.save_freq=256", "trainer.target_return=null"])
    with RLTrainer(cfg) as run:
        run.train()
    changed = load_env_config(EXAMPLES / "ppo_cartpole.yaml", ["ppo.lr=0.5", "trainer.total_env_steps=1024"])
    with pytest.raises(ValueError, match="different ppo.lr"):
        RLTrainer(changed, resume=run.run_dir)
