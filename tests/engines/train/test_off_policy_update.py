"""actor.loss.off_policy in the actor update: the decoupled objective is the plain update
with advantages w * A (w: truncated pi_old / mu), and w = 1 leaves the update unchanged."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.algorithms import PolicyLossConfig
from hybridflow.algorithms.off_policy import OffPolicyConfig
from hybridflow.engines.train import ActorEngine, ActorLossConfig, MicroBatchConfig, OptimConfig, TrainEngineConfig
from train_harness import make_rl_batch

N = 8


def _engine(path: str, off_policy: OffPolicyConfig) -> ActorEngine:
    torch.manual_seed(0)
    config = TrainEngineConfig(
        model_path=path, dtype="fp32", seed=0, optim=OptimConfig(lr=1e-2, weight_decay=0.0, grad_clip=0.0),
        micro_batch=MicroBatchConfig(mini_batch_size=N, micro_batch_size_per_device=4,
                                     forward_micro_batch_size_per_device=4),
    )
    return ActorEngine(config, ActorLossConfig(policy=PolicyLossConfig(loss_mode="vanilla"), off_policy=off_policy))


def _params(engine: ActorEngine) -> list[torch.Tensor]:
    return [p.detach().clone() for _, p in engine.named_sharded_parameters()]


@pytest.mark.usefixtures("single_process_group")
def test_decoupled_update_equals_plain_update_with_weighted_advantages(tiny_llama_dir):
    batch = make_rl_batch(N, seed=4)
    gen = torch.Generator().manual_seed(1)
    batch["rollout_log_probs"] = batch["old_log_probs"] + 0.5 * torch.randn(batch["old_log_probs"].shape, generator=gen)
    off = OffPolicyConfig(is_level="token", is_cap=1.5)
    got_engine = _engine(str(tiny_llama_dir), off)
    got = got_engine.update_policy(batch)

    ratio = torch.exp(batch["old_log_probs"] - batch["rollout_log_probs"])
    weights = torch.where(batch["response_mask"].bool(), ratio.clamp(max=1.5), torch.zeros(()))
    ref_engine = _engine(str(tiny_llama_dir), OffPolicyConfig())
    plain = {k: v for k, v in batch.items() if k != "rollout_log_probs"}
    want = ref_engine.update_policy({**plain, "advantages": batch["advantages"] * weights})

    assert got["actor/pg_loss"] == pytest.approx(want["actor/pg_loss"], abs=1e-6)
    for a, b in zip(_params(got_engine), _params(ref_engine)):
        assert torch.allclose(a, b, atol=1e-6)
    mask = batch["response_mask"].bool()
    assert 0 < got["actor/is_frac_capped"] < 1
    # like every update metric: per micro-batch, then averaged (a micro-batch may not reach the cap)
    assert 1.0 < got["actor/is_weight_max"] <= 1.5 + 1e-6
    assert math.isfinite(got["actor/behaviour_kl"])
    assert got["actor/is_weight_mean"] == pytest.approx(float(weights[mask].mean()), rel=0.05)  # mean of micro-batch means


@pytest.mark.usefixtures("single_process_group")
def test_off_policy_update_needs_rollout_log_probs(tiny_llama_dir):
    engine = _engine(str(tiny_llama_dir), OffPolicyConfig(is_level="sequence"))
    with pytest.raises(KeyError, match="rollout_log_probs"):
        engine.update_policy(make_rl_batch(N, seed=4))
