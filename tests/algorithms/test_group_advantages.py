"""Group-baseline estimators: hand-computed cases, shift invariance, masking, degenerate groups."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hybridflow.algorithms import AdvantageConfig, adv_estimators, compute_advantage, masked_whiten

from ._helpers import FAST, mask_from_lengths, outcome_rewards, poison_masked

EPS = 1e-6
CFG = AdvantageConfig(epsilon=EPS)
GROUP_ESTIMATORS = ["grpo", "grpo_passk", "rloo", "reinforce_plus_plus_baseline", "opo", "gpg"]
UID = np.array(["a", "a", "a", "b", "b"])
LENGTHS = [3, 1, 2, 3, 2]


def _seq_adv(name, scores, uid=UID, lengths=LENGTHS, config=CFG):
    """Run an estimator on outcome rewards and return (per-sequence advantage, token advantages)."""
    mask = mask_from_lengths(lengths, max(lengths))
    adv, ret = compute_advantage(name, outcome_rewards(scores, mask), mask, uid=uid, config=config)
    torch.testing.assert_close(adv, ret)
    # Every kept token of a response carries the same advantage; padding carries 0.
    firsts = adv[:, 0]
    assert torch.equal(adv, torch.where(mask, firsts.unsqueeze(-1).expand_as(adv), torch.zeros(())))
    return firsts.tolist(), adv


def test_grpo_hand_computed():
    got, _ = _seq_adv("grpo", [1, 0, 0, 2, 4])
    std_a, std_b = math.sqrt(1 / 3), math.sqrt(2)  # unbiased stds of {1,0,0} and {2,4}
    expected = [(2 / 3) / (std_a + EPS), (-1 / 3) / (std_a + EPS), (-1 / 3) / (std_a + EPS)]
    expected += [-1 / (std_b + EPS), 1 / (std_b + EPS)]
    assert got == pytest.approx(expected)


def test_dr_grpo_skips_the_std_division():
    got, _ = _seq_adv("grpo", [1, 0, 0, 2, 4], config=AdvantageConfig(norm_adv_by_std_in_grpo=False))
    assert got == pytest.approx([2 / 3, -1 / 3, -1 / 3, -1.0, 1.0])


def test_grpo_all_equal_group_is_exactly_zero_and_singletons_keep_raw_score():
    got, _ = _seq_adv("grpo", [0.1, 0.1, 0.1, 5.0, 7.0], uid=np.array([0, 0, 0, 1, 2]))
    assert got[:3] == [0.0, 0.0, 0.0]
    assert got[3:] == pytest.approx([5.0 / (1 + EPS), 7.0 / (1 + EPS)])


def test_grpo_passk_credits_only_the_best_sample():
    got, _ = _seq_adv("grpo_passk", [1, 3, 2, 4, 4])
    # group a: best 3, second best 2, std of {1,3,2} = 1; group b: a tie gives 0.
    assert got == pytest.approx([0.0, 1 / (1 + EPS), 0.0, 0.0, 0.0])
    got, _ = _seq_adv("grpo_passk", [1, 3, 2, 4, 4], config=AdvantageConfig(norm_adv_by_std_in_grpo=False))
    assert got == [0.0, 1.0, 0.0, 0.0, 0.0]


def test_rloo_hand_computed():
    got, _ = _seq_adv("rloo", [1, 0, 0, 2, 4])
    # r_i minus the mean of the other samples of its group.
    assert got == pytest.approx([1.0, -0.5, -0.5, -2.0, 2.0])


def test_reinforce_plus_plus_baseline_hand_computed():
    _, adv = _seq_adv("reinforce_plus_plus_baseline", [1, 0, 0, 2, 4])
    centred = torch.tensor([2 / 3, -1 / 3, -1 / 3, -1.0, 1.0], dtype=torch.float64)
    mask = mask_from_lengths(LENGTHS, 3)
    expected = masked_whiten(centred.unsqueeze(-1).expand(5, 3).clone(), mask)  # token-level whitening
    torch.testing.assert_close(adv, expected)


def test_opo_length_weighted_baseline():
    got, _ = _seq_adv("opo", [1, 0, 2, 4], uid=np.array([0, 0, 1, 1]), lengths=[1, 3, 2, 2])
    # group 0: b = (1*1 + 3*0) / 4 = 0.25; group 1: equal lengths -> b = 3.
    assert got == pytest.approx([0.75, -0.25, -1.0, 1.0])


def test_gpg_rescales_by_the_fraction_of_valid_samples():
    uid = np.array([0, 0, 1, 1, 2, 2])
    got, _ = _seq_adv("gpg", [1, 0, 1, 1, 0, 0], uid=uid, lengths=[2] * 6)
    # 4 of 6 samples are in all-equal groups: alpha = 6 / (6 - 4) = 3.
    assert got == pytest.approx([1.5, -1.5, 0.0, 0.0, 0.0, 0.0])
    got, _ = _seq_adv("gpg", [1, 0, 1, 1, 0, 0], uid=uid, lengths=[2] * 6, config=AdvantageConfig(gpg_norm_by_std=True))
    assert got[:2] == pytest.approx([1.5 / (math.sqrt(0.5) + 1e-6), -1.5 / (math.sqrt(0.5) + 1e-6)])


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_uid_is_required_and_checked(name):
    mask = torch.ones(2, 2)
    with pytest.raises(ValueError, match="uid"):
        compute_advantage(name, torch.zeros(2, 2), mask, config=CFG)
    with pytest.raises(ValueError, match="uid"):
        compute_advantage(name, torch.zeros(2, 2), mask, uid=np.array([0, 0, 0]), config=CFG)


# ----------------------------------------------------------------------------- properties


@st.composite
def grouped_batch(draw, min_group=1):
    sizes = draw(st.lists(st.integers(min_group, 5), min_size=1, max_size=4))
    uid = np.repeat(np.arange(len(sizes)), sizes)
    perm = draw(st.permutations(list(range(len(uid)))))
    uid = uid[np.array(perm)]
    b = len(uid)
    # Scores on a coarse grid so shifting by an integer is exact in float64.
    scores = draw(st.lists(st.integers(-8, 8), min_size=b, max_size=b))
    lengths = draw(st.lists(st.integers(1, 5), min_size=b, max_size=b))
    return uid, [s / 2 for s in scores], lengths


@FAST
@given(batch=grouped_batch(min_group=2), shift=st.integers(-100, 100), name=st.sampled_from(GROUP_ESTIMATORS))
def test_adding_a_constant_to_a_group_leaves_advantages_unchanged(batch, shift, name):
    uid, scores, lengths = batch
    shifted = [s + shift if u == uid[0] else s for s, u in zip(scores, uid)]
    mask = mask_from_lengths(lengths, 5)
    base, _ = compute_advantage(name, outcome_rewards(scores, mask), mask, uid=uid, config=CFG)
    moved, _ = compute_advantage(name, outcome_rewards(shifted, mask), mask, uid=uid, config=CFG)
    torch.testing.assert_close(moved, base, rtol=1e-9, atol=1e-9)


@FAST
@given(batch=grouped_batch(), seed=st.integers(0, 1000), name=st.sampled_from(adv_estimators()))
def test_masked_positions_never_change_any_estimator(batch, seed, name):
    uid, scores, lengths = batch
    g = torch.Generator().manual_seed(seed)
    mask = mask_from_lengths(lengths, 6)
    mask &= torch.rand(mask.shape, generator=g) < 0.8  # holes inside responses too
    rewards = torch.where(mask, torch.randn(mask.shape, generator=g, dtype=torch.float64), torch.zeros(()))
    values = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    extra = {"baseline_rewards": torch.randn(len(uid), generator=g, dtype=torch.float64)}
    clean = compute_advantage(name, rewards, mask, values=values, uid=uid, config=CFG, **extra)
    dirty = compute_advantage(
        name, poison_masked(rewards, mask, seed), mask, values=poison_masked(values, mask, seed + 1),
        uid=uid, config=CFG, **extra,
    )
    for c, d in zip(clean, dirty):
        torch.testing.assert_close(d, c, rtol=0, atol=0)


@pytest.mark.parametrize("name", adv_estimators())
@pytest.mark.parametrize("case", ["all_equal", "empty_responses", "single_sample_groups", "all_empty"])
def test_degenerate_inputs_give_finite_results(name, case):
    uid = np.array([0, 0, 0, 1, 1, 2])
    lengths = [3, 2, 3, 1, 3, 2]
    scores = [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    if case == "empty_responses":
        lengths = [0, 2, 0, 0, 3, 0]
        scores = [0.0, 1.0, 0.0, 0.0, 2.0, 0.0]
    elif case == "single_sample_groups":
        uid = np.arange(6)
        scores = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    elif case == "all_empty":
        lengths = [0] * 6
    mask = mask_from_lengths(lengths, 3)
    rewards = outcome_rewards(scores, mask)
    extra = {"baseline_rewards": torch.ones(6, dtype=torch.float64)}
    adv, ret = compute_advantage(name, rewards, mask, values=torch.zeros(6, 3), uid=uid, config=CFG, **extra)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert adv[~mask].abs().sum() == 0 and ret[~mask].abs().sum() == 0
    if case == "all_equal" and name in GROUP_ESTIMATORS:
        # Groups 0 and 1 are all-equal: exactly zero advantage before any batch whitening
        # (which then shifts them all by the same amount).
        values = adv[:5][mask[:5]]
        expected = values[0] if name == "reinforce_plus_plus_baseline" else 0.0
        assert torch.all(values == expected)


def test_uid_may_be_strings_ints_or_a_tensor():
    mask = mask_from_lengths([1, 1, 1, 1], 1)
    rewards = outcome_rewards([1, 0, 2, 4], mask)
    outs = [
        compute_advantage("grpo", rewards, mask, uid=u, config=CFG)[0]
        for u in (np.array(["p", "p", "q", "q"], dtype=object), np.array([7, 7, 9, 9]), torch.tensor([7, 7, 9, 9]), ["p", "p", "q", "q"])
    ]
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0])
