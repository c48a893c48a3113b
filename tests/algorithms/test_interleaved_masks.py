"""Multi-turn responses interleave model tokens (mask 1) with environment tokens (mask 0).

Every advantage estimator and loss aggregation must treat such a row exactly like the row
made of its model tokens alone: environment tokens are context, never steps. Checked by
comparing each result on interleaved rows with the result on the same rows compacted
(model tokens moved to the front, same width), scattered back.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow.algorithms.advantages import AdvantageConfig, adv_estimators, compute_advantage
from hybridflow.algorithms.aggregation import agg_loss, loss_agg_modes


def _interleaved(b: int = 6, t: int = 24, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros(b, t, dtype=torch.long)
    for i in range(b):
        pos, length = 0, int(torch.randint(t // 2, t, (1,), generator=gen))
        while pos < length:  # alternate model turns and observations of random lengths
            turn = int(torch.randint(1, 5, (1,), generator=gen))
            mask[i, pos: min(pos + turn, length)] = 1
            pos += turn + int(torch.randint(1, 4, (1,), generator=gen))
    return mask, gen


def _compact(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x)
    for i in range(x.shape[0]):
        kept = x[i][mask[i].bool()]
        out[i, : kept.numel()] = kept
    return out


def _compact_mask(mask: torch.Tensor) -> torch.Tensor:
    counts = mask.sum(-1, keepdim=True)
    return (torch.arange(mask.shape[1])[None] < counts).long()


@pytest.mark.parametrize("estimator", adv_estimators())
@pytest.mark.parametrize("whiten", [False, True])
def test_advantages_skip_environment_tokens(estimator, whiten):
    mask, gen = _interleaved()
    rewards = torch.randn(mask.shape, generator=gen) * mask
    values = torch.randn(mask.shape, generator=gen)
    uid = np.array(["a", "a", "a", "b", "b", "b"], dtype=object)
    config = AdvantageConfig(gamma=0.9, lam=0.8, whiten_gae_advantages=whiten)
    baseline = torch.randn(mask.shape[0], generator=gen)  # remax's greedy-rollout rewards
    adv, ret = compute_advantage(estimator, rewards, mask, values=values, uid=uid, config=config,
                                 baseline_rewards=baseline)
    cmask = _compact_mask(mask)
    cadv, cret = compute_advantage(estimator, _compact(rewards, mask), cmask, values=_compact(values, mask),
                                   uid=uid, config=config, baseline_rewards=baseline)
    torch.testing.assert_close(_compact(adv, mask), cadv, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(_compact(ret, mask), cret, rtol=1e-5, atol=1e-6)
    assert float((adv * (1 - mask)).abs().sum()) == 0.0  # nothing on environment tokens


@pytest.mark.parametrize("mode", loss_agg_modes())
def test_loss_aggregations_skip_environment_tokens(mode):
    mask, gen = _interleaved(seed=1)
    loss = torch.randn(mask.shape, generator=gen)
    got = agg_loss(loss, mask, mode)
    want = agg_loss(_compact(loss, mask), _compact_mask(mask), mode)
    torch.testing.assert_close(got, want)
