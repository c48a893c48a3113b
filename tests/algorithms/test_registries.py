"""Registries: lookup errors, user registration, and docs/algorithms.md covering every name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridflow.registry import Registry
from hybridflow.algorithms import (
    AdvantageConfig,
    PolicyLossConfig,
    adv_estimators,
    compute_advantage,
    compute_policy_loss,
    get_adv_estimator,
    get_kl_estimator,
    get_loss_agg_mode,
    get_policy_loss,
    kl_estimators,
    kl_penalty,
    loss_agg_modes,
    policy_losses,
    register_adv_estimator,
    register_kl_estimator,
    register_policy_loss,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "algorithms.md"


@pytest.mark.parametrize(
    "getter, typo, suggestion, key",
    [
        (get_adv_estimator, "rlo", "rloo", "algorithm.adv_estimator"),
        (get_policy_loss, "vanila", "vanilla", "actor.loss.policy.loss_mode"),
        (get_loss_agg_mode, "seq-mean-token-sum-nrm", "seq-mean-token-sum-norm", "actor.loss.policy.loss_agg_mode"),
        (get_kl_estimator, "low_var", "low_var_kl", "algorithm.kl_penalty"),
    ],
)
def test_unknown_name_lists_known_names_and_the_closest(getter, typo, suggestion, key):
    with pytest.raises(ValueError) as err:
        getter(typo)
    msg = str(err.value)
    assert f"did you mean {suggestion!r}" in msg and key in msg and "known:" in msg


def test_user_registered_estimator_and_loss_are_used():
    @register_adv_estimator("test_only_constant", override=True)
    def constant(token_level_rewards, response_mask, *, values=None, uid=None, config, **extra):
        adv = torch.full_like(token_level_rewards, 2.0) * response_mask
        return adv, adv

    adv, _ = compute_advantage("test_only_constant", torch.zeros(2, 3), torch.ones(2, 3), config=AdvantageConfig())
    assert adv.sum().item() == 12.0

    @register_policy_loss("test_only_sum", override=True)
    def summed(old_log_prob, log_prob, advantages, response_mask, *, config, agg=None):
        return (log_prob * response_mask).sum(), {}

    loss, _ = compute_policy_loss(
        torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1, 2), torch.ones(1, 2),
        config=PolicyLossConfig(loss_mode="test_only_sum"),
    )
    assert loss.item() == 2.0

    @register_kl_estimator("test_only_sq", override=True)
    def sq(log_prob, ref_log_prob):
        return (log_prob - ref_log_prob) ** 2

    assert kl_penalty(torch.ones(1, 1) * 3, torch.zeros(1, 1), "test_only_sq").item() == 9.0


def test_duplicate_registration_needs_override():
    reg: Registry = Registry("thing", "x.y")
    reg.register("a")(len)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(print)
    reg.register("a", override=True)(print)
    assert reg.get("a") is print and "a" in reg


def test_required_names_are_registered():
    assert {"gae", "grpo", "grpo_passk", "rloo", "remax", "reinforce_plus_plus",
            "reinforce_plus_plus_baseline", "opo", "gpg"} <= set(adv_estimators())
    assert {"vanilla", "gspo", "cispo", "reinforce", "gpg"} <= set(policy_losses())
    assert {"k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"} <= set(kl_estimators())


def test_docs_list_every_builtin_name():
    text = DOC.read_text()
    names = adv_estimators() + policy_losses() + loss_agg_modes() + kl_estimators()
    builtin = [n for n in names if not n.startswith("test_only_")]
    missing = [n for n in builtin if f"`{n}`" not in text]
    assert not missing, f"docs/algorithms.md does not document: {missing}"
    for key in ("algorithm.adv_estimator", "actor.loss.policy.loss_mode", "actor.loss.policy.loss_agg_mode",
                "algorithm.kl_penalty", "actor.loss.kl_loss_type"):
        assert key in text
