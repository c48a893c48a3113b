"""KL estimators, straight-through variants, KL in the reward, KL loss and KL controllers."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.algorithms import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_in_reward,
    build_kl_controller,
    kl_estimators,
    kl_loss,
    kl_penalty,
)

LOGP = torch.tensor([[0.5, -0.5, 0.0]], dtype=torch.float64)  # delta = log pi - log pi_ref
REF = torch.zeros(1, 3, dtype=torch.float64)


@pytest.mark.parametrize(
    "kl_type, expected",
    [
        ("k1", [0.5, -0.5, 0.0]),
        ("abs", [0.5, 0.5, 0.0]),
        ("k2", [0.125, 0.125, 0.0]),
        ("k3", [math.exp(-0.5) + 0.5 - 1, math.exp(0.5) - 0.5 - 1, 0.0]),
    ],
)
def test_estimators_hand_computed(kl_type, expected):
    assert kl_penalty(LOGP, REF, kl_type)[0].tolist() == pytest.approx(expected)


@pytest.mark.parametrize("alias, name", [("kl", "k1"), ("mse", "k2"), ("low_var_kl", "k3")])
def test_verl_aliases(alias, name):
    assert torch.equal(kl_penalty(LOGP, REF, alias), kl_penalty(LOGP, REF, name))


@pytest.mark.parametrize("base", kl_estimators())
def test_straight_through_value_of_base_gradient_of_k2(base):
    logp = LOGP.clone().requires_grad_(True)
    out = kl_penalty(logp, REF, base + "+")
    torch.testing.assert_close(out.detach(), kl_penalty(LOGP, REF, base))
    out.sum().backward()
    torch.testing.assert_close(logp.grad, LOGP - REF)  # d k2 / d log pi = delta


def _exact_expectation(kl_type: str, logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """E_{x ~ pi}[k(x)] over a small vocabulary, computed exactly (weights detached like sampling)."""
    logp = torch.log_softmax(logits, -1)
    ref = torch.log_softmax(ref_logits, -1)
    return (logp.exp().detach() * kl_penalty(logp, ref, kl_type)).sum()


def test_k1_and_k3_are_unbiased_and_k3_plus_has_the_true_kl_gradient():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=True)
    ref_logits = torch.randn(7, generator=g, dtype=torch.float64)
    p, q = torch.softmax(logits, -1), torch.softmax(ref_logits, -1)
    true_kl = (p * (p.log() - q.log())).sum()
    for kl_type in ("k1", "k3"):
        assert _exact_expectation(kl_type, logits, ref_logits).item() == pytest.approx(true_kl.item())
    (true_grad,) = torch.autograd.grad(true_kl, logits)
    (st_grad,) = torch.autograd.grad(_exact_expectation("k3+", logits, ref_logits), logits)
    torch.testing.assert_close(st_grad, true_grad)
    # ...whereas differentiating k1 itself gives a zero expected gradient (Tang & Munos 2025).
    (k1_grad,) = torch.autograd.grad(_exact_expectation("k1", logits, ref_logits), logits)
    assert k1_grad.abs().max() < 1e-12 < true_grad.abs().max()


def test_k3_is_finite_and_clamped_for_extreme_log_ratios():
    logp = torch.tensor([[-200.0, 0.0, 200.0]])
    out = kl_penalty(logp, torch.zeros(1, 3), "k3")
    assert torch.isfinite(out).all() and out.max().item() == 10.0 and out.min().item() >= 0.0


def test_unknown_kl_type():
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(LOGP, REF, "low_var")
    with pytest.raises(ValueError, match="KL estimator"):
        kl_penalty(LOGP, REF, "nope+")


def test_apply_kl_in_reward_hand_computed_and_updates_the_controller():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]], dtype=torch.float64)
    old = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, 5.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.0, -0.5], [-2.0, -1.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=1.0, horizon=100)
    rewards, metrics = apply_kl_in_reward(scores, old, ref, mask, ctrl, "k1")
    # kl row 0 = [0.5, 0, -0.5] (mean 0), row 1 = [1, 0] (mean 0.5); beta = 0.1 before update.
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 0.0, 1.05], [-0.1, 2.0, 0.0]], dtype=torch.float64))
    assert metrics == {"kl_penalty": pytest.approx(0.25), "kl_coef": 0.1}
    # error = clip(0.25 / 1 - 1, -0.2, 0.2) = -0.2; n_steps = batch size 2.
    assert ctrl.value == pytest.approx(0.1 * (1 - 0.2 * 2 / 100))
    frozen = FixedKLController(0.1)
    apply_kl_in_reward(scores, old, ref, mask, frozen, "k1", update_controller=False)
    assert frozen.value == 0.1


def test_kl_loss_aggregates_and_backpropagates():
    logp = LOGP.clone().requires_grad_(True)
    mask = torch.tensor([[1, 1, 0]])
    loss, metrics = kl_loss(logp, REF, mask, kl_type="k2", loss_agg_mode="token-mean")
    assert loss.item() == pytest.approx(0.125) and metrics["kl_loss"].item() == pytest.approx(0.125)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.25, -0.25, 0.0])


# ----------------------------------------------------------------------------- controllers


def test_fixed_controller_never_moves():
    ctrl = FixedKLController(0.05)
    ctrl.update(100.0, n_steps=1000)
    assert ctrl.value == 0.05


def test_adaptive_controller_follows_ziegler_et_al():
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=6.0, horizon=10_000)
    ctrl.update(12.0, n_steps=256)  # error 1.0 clipped to 0.2
    assert ctrl.value == pytest.approx(0.1 * (1 + 0.2 * 256 / 10_000))
    before = ctrl.value
    ctrl.update(5.4, n_steps=256)  # error -0.1, inside the clip
    assert ctrl.value == pytest.approx(before * (1 - 0.1 * 256 / 10_000))


def test_controller_state_round_trip():
    ctrl = AdaptiveKLController(0.1, 6.0, 10_000)
    ctrl.update(12.0, 256)
    restored = AdaptiveKLController(0.5, 1.0, 5)
    restored.load_state_dict(ctrl.state_dict())
    assert (restored.value, restored.target_kl, restored.horizon) == (ctrl.value, 6.0, 10_000)
    fixed = FixedKLController(0.2)
    fixed.load_state_dict(FixedKLController(0.3).state_dict())
    assert fixed.value == 0.3
    with pytest.raises(ValueError, match="adaptive"):
        fixed.load_state_dict(ctrl.state_dict())


def test_controller_validation_and_factory():
    with pytest.raises(ValueError, match="target_kl"):
        AdaptiveKLController(0.1, 0.0, 10)
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(0.1, 1.0, 0)
    with pytest.raises(ValueError, match="kl_coef"):
        FixedKLController(-1.0)
    assert isinstance(build_kl_controller("fixed", 0.1), FixedKLController)
    assert isinstance(build_kl_controller("adaptive", 0.1, target_kl=1.0, horizon=10), AdaptiveKLController)
    with pytest.raises(ValueError, match="target_kl"):
        build_kl_controller("adaptive", 0.1)
    with pytest.raises(ValueError, match="kl_ctrl.type"):
        build_kl_controller("pid", 0.1)
