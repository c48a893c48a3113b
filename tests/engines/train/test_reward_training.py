"""Bradley-Terry loss against a hand computation, and the trainable reward-model engine
(one process) against a plain model trained with the same loss.

fp32 throughout; tolerances: scores 1e-5 abs, loss 1e-5 abs, parameters after one AdamW
step 1e-5 abs (same math, different summation order over micro-batches).
"""

from __future__ import annotations

import math

import pytest
import torch
from hybridflow.engines.train.distributed import full_tensor

from hybridflow.algorithms import AggregationScale, bradley_terry_loss, pairwise_accuracy
from hybridflow.engines.models import load_model
from hybridflow.engines.train import MicroBatchConfig, OptimConfig, RewardModelEngine, TrainEngineConfig
from hybridflow.engines.train.forward import reward_scores
from hybridflow.engines.train.reward import stack_pairs


def test_bradley_terry_loss_matches_a_hand_computation():
    chosen = torch.tensor([2.0, 0.5, -1.0], requires_grad=True)
    rejected = torch.tensor([1.0, 1.5, -1.0], requires_grad=True)
    loss, metrics = bradley_terry_loss(chosen, rejected)
    # margins 1, -1, 0: -log sigmoid(m) = log(1 + e^-m)
    hand = (math.log(1 + math.exp(-1)) + math.log(1 + math.exp(1)) + math.log(2)) / 3
    assert abs(loss.item() - hand) < 1e-6
    assert abs(metrics["accuracy"].item() - 1 / 3) < 1e-6  # a tie counts as wrong
    assert abs(metrics["margin"].item()) < 1e-6
    assert abs(metrics["chosen_score"].item() - 0.5) < 1e-6
    assert abs(metrics["rejected_score"].item() - 0.5) < 1e-6
    loss.backward()
    # d loss / d chosen_i = -(1 - sigmoid(m_i)) / B, and the opposite for rejected
    sig = [1 / (1 + math.exp(-m)) for m in (1.0, -1.0, 0.0)]
    expected = torch.tensor([-(1 - s) / 3 for s in sig])
    assert (chosen.grad - expected).abs().max() < 1e-6
    assert (rejected.grad + expected).abs().max() < 1e-6


def test_bradley_terry_loss_is_finite_for_huge_margins():
    loss, _ = bradley_terry_loss(torch.tensor([-1000.0]), torch.tensor([1000.0]))
    assert abs(loss.item() - 2000.0) < 1e-3
    loss, _ = bradley_terry_loss(torch.tensor([1000.0]), torch.tensor([-1000.0]))
    assert loss.item() == 0.0


def test_bradley_terry_loss_micro_batches_add_up_with_global_counts():
    g = torch.Generator().manual_seed(0)
    chosen, rejected = torch.randn(6, generator=g), torch.randn(6, generator=g)
    full, full_metrics = bradley_terry_loss(chosen, rejected)
    # Two "ranks" of 3 pairs, each in micro-batches of 2 and 1: sum over micro, mean over ranks.
    agg = AggregationScale(global_tokens=6, global_seqs=6, dp_size=2)
    per_rank = []
    for rank in (slice(0, 3), slice(3, 6)):
        c, r = chosen[rank], rejected[rank]
        parts = [bradley_terry_loss(c[s], r[s], agg) for s in (slice(0, 2), slice(2, 3))]
        per_rank.append((sum(p[0] for p in parts), sum(p[1]["accuracy"] for p in parts)))
    assert abs(sum(p[0] for p in per_rank) / 2 - full) < 1e-6
    assert abs(sum(p[1] for p in per_rank) / 2 - full_metrics["accuracy"]) < 1e-6


def test_bradley_terry_loss_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="same B"):
        bradley_terry_loss(torch.zeros(3), torch.zeros(2))
    with pytest.raises(ValueError, match="same B"):
        bradley_terry_loss(torch.zeros(3, 1), torch.zeros(3, 1))
    assert pairwise_accuracy(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0])) == 0.5


# ----------------------------------------------------------------------------- engine


def _pair_batch(n: int, seed: int, length: int = 9, vocab: int = 256) -> dict[str, torch.Tensor]:
    """Left-padded chosen/rejected sequences of random lengths (ids >= 3: no pad/bos/eos)."""
    g = torch.Generator().manual_seed(seed)
    batch = {}
    for side in ("chosen", "rejected"):
        lens = torch.randint(2, length + 1, (n,), generator=g)
        mask = (torch.arange(length) >= (length - lens)[:, None]).long()
        batch[f"{side}_input_ids"] = torch.randint(3, vocab, (n, length), generator=g) * mask
        batch[f"{side}_attention_mask"] = mask
        batch[f"{side}_position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0) * mask
    return batch


def _config(path, **kw) -> TrainEngineConfig:
    mb = MicroBatchConfig(mini_batch_size=4, micro_batch_size_per_device=2, forward_micro_batch_size_per_device=3)
    return TrainEngineConfig(model_path=str(path), dtype="fp32", micro_batch=mb, **kw)


@pytest.mark.usefixtures("single_process_group")
@pytest.mark.parametrize("pack", [False, True])
def test_pair_scores_equal_scores_of_each_side(tiny_reward_dir, pack):
    batch = _pair_batch(5, seed=1)
    engine = RewardModelEngine(_config(tiny_reward_dir, pack_sequences=pack))
    chosen, rejected = engine.compute_pair_scores(batch)
    assert chosen.shape == rejected.shape == (5,)
    stacked = engine.compute_scores(stack_pairs(batch))
    assert (torch.cat([chosen, rejected]) - stacked).abs().max() < 1e-5
    with pytest.raises(RuntimeError, match="needs a trainable engine"):
        engine.update_reward_model(batch)


@pytest.mark.usefixtures("single_process_group")
def test_update_matches_one_adamw_step_of_a_plain_model(tiny_reward_dir):
    batch = _pair_batch(4, seed=2)
    optim = OptimConfig(lr=1e-2, weight_decay=0.0, grad_clip=1e9)
    engine = RewardModelEngine(_config(tiny_reward_dir, optim=optim), trainable=True)
    ref = load_model(tiny_reward_dir, "reward")
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.0, foreach=False)
    scores = reward_scores(ref, stack_pairs(batch), pack_sequences=False)
    loss, metrics = bradley_terry_loss(scores[:4], scores[4:])
    loss.backward()
    opt.step()
    # mini-batch 4 pairs in two micro-batches of 2: gradients accumulate to the full batch's
    got = engine.update_reward_model(batch)
    assert abs(got["rm/loss"] - loss.item()) < 1e-5
    assert abs(got["rm/accuracy"] - metrics["accuracy"].item()) < 1e-6
    assert abs(got["rm/margin"] - metrics["margin"].item()) < 1e-5
    engine_params = {n: full_tensor(p) for n, p in engine.named_sharded_parameters()}
    # Adam's first step moves each weight by ~lr * g / (|g| + eps): elements whose gradient is
    # near eps amplify the last-bit differences of micro-batch accumulation (seen: 3e-5 on one
    # weight of o_proj), so the tolerance is 1% of lr; a wrong update is off by ~lr.
    for name, p in ref.named_parameters():
        assert (engine_params[name] - p).abs().max() < 1e-2 * optim.lr, name
    # and the scores moved the way the loss wants: a second look at the batch scores the pairs better
    chosen, rejected = engine.compute_pair_scores(batch)
    after, _ = bradley_terry_loss(chosen, rejected)
    assert after.item() < loss.item()


@pytest.mark.usefixtures("single_process_group")
def test_pair_batch_errors_name_the_problem(tiny_reward_dir):
    engine = RewardModelEngine(_config(tiny_reward_dir))
    batch = _pair_batch(3, seed=3)
    with pytest.raises(KeyError, match="rejected_input_ids"):
        engine.compute_pair_scores({k: v for k, v in batch.items() if k != "rejected_input_ids"})
    batch["rejected_input_ids"] = batch["rejected_input_ids"][:, 1:]
    with pytest.raises(ValueError, match="padded to one shape"):
        engine.compute_pair_scores(batch)
