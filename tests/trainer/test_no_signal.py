"""Steps without learning signal (issue 25): every group's advantages 0 is said on the
console (with what the optimizer did: skipped by default, actor.loss.skip_no_signal_updates),
counted in adv/no_signal_steps, and stops the run after trainer.max_no_signal_steps such
steps in a row (off by default)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow import RLTrainer
from hybridflow.algorithms import silent_groups
from hybridflow.config import ConfigError
from hybridflow.config.schema import load_run_config
from hybridflow.trainer.observe.signal import NO_SIGNAL_STEPS, SignalWatch
from trainer_helpers import rl_records


def test_silent_groups_counts_groups_whose_every_response_token_has_zero_advantage():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1]])
    # Group a: all 0 on response tokens (the 5.0 sits on a padding token); group b: one token moves.
    adv = torch.tensor([[0.0, 0.0, 5.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.3, 0.0]])
    assert silent_groups(adv, mask, np.array(["a", "a", "b", "b"], dtype=object)) == (1, 2)
    assert silent_groups(torch.zeros(4, 3), mask, np.array([0, 1, 2, 3])) == (4, 4)


def test_the_watch_says_each_silent_step_and_stops_after_the_limit_in_a_row():
    lines: list[str] = []
    watch = SignalWatch(2, lines.append)
    silent = {"adv/silent_groups": 4.0, "adv/groups": 4.0, "score/mean": 0.0}
    steps = [dict(silent), {"adv/silent_groups": 1.0, "adv/groups": 4.0}, dict(silent), dict(silent)]
    reasons = [watch.stop_reason(i + 1, m) for i, m in enumerate(steps)]
    assert [m[NO_SIGNAL_STEPS] for m in steps] == [1.0, 0.0, 1.0, 2.0]
    assert reasons[:3] == [None, None, None] and "trainer.max_no_signal_steps=2" in reasons[3]
    assert len(lines) == 3 and all("no learning signal" in line for line in lines)
    assert "step 1:" in lines[0] and "all 4 groups" in lines[0]


def test_the_line_says_whether_the_optimizer_step_was_skipped():
    lines: list[str] = []
    watch = SignalWatch(None, lines.append)
    silent = {"adv/silent_groups": 4.0, "adv/groups": 4.0}
    watch.stop_reason(1, {**silent, "actor/skipped_no_signal": 1.0})
    watch.stop_reason(2, dict(silent))  # the setting off: the update reports no skip metric
    assert "the optimizer step was skipped (weights and optimizer state unchanged)" in lines[0]
    assert "optimizer still stepped on nothing (actor.loss.skip_no_signal_updates=false)" in lines[1]
    assert load_run_config(None, []).actor.loss.skip_no_signal_updates is True


def test_the_limit_is_off_by_default_and_must_be_positive():
    assert load_run_config(None, []).trainer.max_no_signal_steps is None
    with pytest.raises(ConfigError, match=r"^trainer\.max_no_signal_steps: must be >= 1"):
        load_run_config(None, ["trainer.max_no_signal_steps=0"])


def test_a_run_whose_reward_never_differs_stops_after_the_limit_and_still_exports(ray_local, tiny_config, tmp_path):
    reward_file = tmp_path / "flat_reward.py"
    reward_file.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                           "    return 0.0\n")
    cfg = tiny_config("resources.world_size=1", f"reward.custom_fn_path={reward_file}", "trainer.total_steps=5",
                      "trainer.max_no_signal_steps=2", "trainer.save_final_model=true",
                      "actor.loss.skip_no_signal_updates=true")
    with RLTrainer(cfg) as trainer:
        result = trainer.train()
    assert result.steps == 2 and "trainer.max_no_signal_steps=2" in result.stopped
    records = rl_records(result.run_dir)
    assert [r[NO_SIGNAL_STEPS] for r in records] == [1.0, 2.0]
    assert all(r["adv/silent_groups"] == r["adv/groups"] == 4.0 for r in records)
    assert all(r["actor/skipped_no_signal"] == 1.0 for r in records)  # no optimizer step on nothing
    assert (result.run_dir / "final_model" / "config.json").is_file()  # nothing the run made is lost


@pytest.mark.slow
def test_a_resumed_run_counts_on_and_shows_its_own_step_numbers(ray_local, tiny_config, tmp_path, capfd):
    """Stopped after 1 of 2 steps and resumed (`hybridflow train --resume`): the progress line
    shows step 2/2, and adv/no_signal_steps goes on 1, 2 as in the run that never stopped."""
    from hybridflow.cli import main

    reward_file = tmp_path / "flat_reward.py"
    reward_file.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                           "    return 0.0\n")
    settings = ("resources.world_size=1", f"reward.custom_fn_path={reward_file}", "trainer.total_steps=2",
                "trainer.save_freq=1", "trainer.val_before_train=false")
    with RLTrainer(tiny_config(*settings)) as trainer:
        whole = trainer.train()
    with RLTrainer(tiny_config(*settings)) as trainer:
        stopped = trainer.train(steps=1)
    capfd.readouterr()
    assert main(["train", "--resume", str(stopped.run_dir), "trainer.console=plain"]) == 0
    out = capfd.readouterr().out
    assert "GRPO: steps 2 to 2" in out and "step 2/2 " in out and "step 1/1 " not in out
    counts = [r[NO_SIGNAL_STEPS] for r in rl_records(whole.run_dir)]
    assert counts == [1.0, 2.0] and [r[NO_SIGNAL_STEPS] for r in rl_records(stopped.run_dir)] == counts
