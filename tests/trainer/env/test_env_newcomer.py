"""Environment RL as a newcomer meets it (issue 26): SAC keeps its update-to-data ratio
whatever the number of runners, more runners than cores is said once, the window mean
return exists from the first episode, and set-up is a public step timed apart."""

from __future__ import annotations

from pathlib import Path

from hybridflow.config.env_schema import load_env_config
from hybridflow import RLTrainer
from hybridflow.trainer.programs.env_phases import sac_gradient_steps
from hybridflow.trainer.env.records import RecordAccumulator
from hybridflow.trainer.env.part import warn_oversubscribed

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def test_sac_updates_per_transition_do_not_depend_on_the_number_of_runners():
    # train_freq 1, gradient_steps 1: one update per environment step, with 1 runner or 8.
    assert sac_gradient_steps(1, 1, env_steps=1) == 1
    assert sac_gradient_steps(1, 1, env_steps=8) == 8
    assert sac_gradient_steps(2, 4, env_steps=32) == 16  # ratio 1/2
    assert sac_gradient_steps(-1, 4, env_steps=32) == 32


def test_more_runners_than_cores_is_said_with_its_cost():
    lines: list[str] = []
    assert not warn_oversubscribed(2, lines.append, cores=2) and not lines
    assert warn_oversubscribed(8, lines.append, cores=2)
    assert len(lines) == 1 and "distributed.num_workers=8" in lines[0] and "2 CPU core(s)" in lines[0]


def test_the_window_mean_counts_from_the_first_episode():
    acc = RecordAccumulator(return_window=20)
    assert acc.window_mean() is None  # nothing finished
    acc.add({"episode_returns": [-3.0, -1.0], "episode_lengths": [5, 5]})
    assert acc.window_mean() == -2.0 and acc.window_mean(full=True) is None
    assert acc.flush(10)["episode/return_mean_window"] == -2.0


def test_setup_is_a_public_step_timed_apart(tmp_path):
    cfg = load_env_config(EXAMPLES / "ppo_cartpole.yaml", [
        f"trainer.output_dir={tmp_path}", "trainer.console=none", "distributed.num_workers=0", "ppo.rollout_steps=64",
        "ppo.minibatch_size=64", "env.num_envs=1", "trainer.target_return=null"])
    with RLTrainer(cfg) as trainer:
        assert trainer.setup() > 0 and trainer.setup() == 0.0  # the second call has nothing to start
        result = trainer.train(steps=128)
    assert result.setup_s == 0.0 and result.wall_s > 0 and result.env_steps == 128
