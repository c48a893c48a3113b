"""Adaptive KL controller: beta has a positive floor that is not absorbing (issue 11)."""

from __future__ import annotations

import pytest

from hybridflow.algorithms import AdaptiveKLController, build_kl_controller


def test_low_kl_drives_beta_to_the_floor_and_high_kl_raises_it_again():
    # n_steps / horizon = 10 > 1 / ERROR_CLIP: the unfloored factor 1 - 0.2 * 10 is negative.
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=1.0, horizon=10)
    for _ in range(3):
        ctrl.update(0.0, n_steps=100)
    assert ctrl.value == pytest.approx(0.1 * AdaptiveKLController.FLOOR_FRACTION)
    ctrl.update(10.0, n_steps=100)  # error clipped to +0.2: factor 1 + 0.2 * 10 = 3
    assert ctrl.value == pytest.approx(3 * 0.1 * AdaptiveKLController.FLOOR_FRACTION)
    for _ in range(10):
        ctrl.update(10.0, n_steps=100)
    assert ctrl.value > 0.1  # back above where it started


def test_slow_decay_stops_at_the_floor_instead_of_underflowing():
    ctrl = AdaptiveKLController(init_kl_coef=1.0, target_kl=1.0, horizon=2)
    for _ in range(20_000):  # factor 0.9 per step: 0.9 ** 20000 underflows to 0.0
        ctrl.update(0.0, n_steps=1)
    assert ctrl.value == ctrl.min_value > 0
    ctrl.update(2.0, n_steps=1)
    assert ctrl.value == pytest.approx(1.1 * ctrl.min_value)


def test_adaptive_controller_rejects_a_zero_initial_coefficient():
    with pytest.raises(ValueError, match=r"kl_coef\) must be > 0 .*type=fixed"):
        build_kl_controller("adaptive", 0.0, target_kl=1.0, horizon=10)
    assert build_kl_controller("fixed", 0.0).value == 0.0  # fixed 0 simply disables the penalty


def test_resume_from_a_zero_beta_checkpoint_restarts_at_the_floor():
    ctrl = AdaptiveKLController(0.2, 1.0, 100)
    ctrl.load_state_dict({"kind": "adaptive", "value": 0.0, "target_kl": 1.0, "horizon": 100})
    assert ctrl.value == pytest.approx(0.2 * AdaptiveKLController.FLOOR_FRACTION)
