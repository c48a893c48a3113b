"""Split invariance with a real torch.distributed all-reduce (2 gloo processes on CPU).

Each rank takes its shard of a mini-batch, cuts it into micro-batches, builds the
AggregationScale with `torch_all_reduce_sum`, runs log-prob -> PPO loss -> backward per
micro-batch, then averages gradients over ranks as the FSDP reduce does. Every rank
checks the result against the single-process gradient of the whole mini-batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hybridflow.algorithms import (
    PolicyLossConfig,
    compute_aggregation_scale,
    compute_policy_loss,
    logprobs_from_logits,
    torch_all_reduce_sum,
)

B, T, D, V = 12, 6, 5, 9
SHARDS = [(0, 5), (5, 12)]  # uneven on purpose
MICRO = [[(0, 2), (2, 5)], [(5, 6), (6, 9), (9, 12)]]


def _problem():
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    labels = torch.randint(0, V, (B, T), generator=g)
    weight0 = torch.randn(D, V, generator=g, dtype=torch.float64) * 0.3
    old = logprobs_from_logits(feats @ weight0, labels).detach() + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.arange(T) < torch.randint(0, T + 1, (B, 1), generator=g)
    return feats, labels, weight0, old, adv, mask


def _loss(weight, feats, labels, old, adv, mask, cfg, agg=None):
    logp = logprobs_from_logits(feats @ weight, labels, chunk_size=4)
    return compute_policy_loss(old, logp, adv, mask, config=cfg, agg=agg)[0]


def _worker(rank: int, world: int, init_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        # token-mean exercises the global token count; seq-mean-token-sum-norm the global
        # sequence count and the constant normaliser.
        for mode in ("token-mean", "seq-mean-token-sum-norm"):
            _check_mode(rank, world, mode)
    finally:
        dist.destroy_process_group()


def _check_mode(rank: int, world: int, mode: str) -> None:
    feats, labels, weight0, old, adv, mask = _problem()
    cfg = PolicyLossConfig(loss_agg_mode=mode, clip_ratio_high=0.28)
    reference = weight0.clone().requires_grad_(True)
    _loss(reference, feats, labels, old, adv, mask, cfg).backward()

    pieces = [slice(a, b) for a, b in MICRO[rank]]
    agg = compute_aggregation_scale(
        [mask[p] for p in pieces], dp_size=world, all_reduce_sum=torch_all_reduce_sum(), loss_scale_factor=T
    )
    assert agg.global_tokens == int(mask.sum()), agg
    weight = weight0.clone().requires_grad_(True)
    for p in pieces:
        _loss(weight, feats[p], labels[p], old[p], adv[p], mask[p], cfg, agg).backward()
    grad = weight.grad.clone()
    dist.all_reduce(grad, op=dist.ReduceOp.SUM)
    grad /= world  # the FSDP gradient reduce is a mean over ranks
    torch.testing.assert_close(grad, reference.grad, rtol=1e-10, atol=1e-12)


def test_two_gloo_ranks_match_the_single_process_gradient(tmp_path):
    mp.spawn(_worker, args=(2, str(tmp_path / "init")), nprocs=2, join=True)
