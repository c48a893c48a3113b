"""The on-policy fused update (fused_old_log_probs: the update computes the old log-probs
itself, none in the batch) equals the update fed the old log-probs of a separate pass over
the same weights.

Tolerance: 1e-5 absolute on losses, grad norm and every parameter after the step (fp32;
the two paths cut the batch into different forward micro-batches, so only the float
summation order differs: the gradients differ by at most 4e-8, against gradients up to
1e-2). Adam's first step moves a weight by lr * g / (|g| + eps), whose slope in g is up
to lr / eps: with the default eps = 1e-8 a weight whose gradient cancels to ~3e-9 turned
a 1e-10 gradient difference into 2.5e-5 (measured). The engines here use eps = 1e-3, so a
step moves at most lr / eps * 4e-8 = 4e-7 apart, while weights with |g| >= eps still move
by about lr. The fused path is refused where it is not exact (two epochs, several
mini-batches).
"""

from __future__ import annotations

import pytest
import torch

from hybridflow.algorithms import PolicyLossConfig
from hybridflow.engines.train import ActorEngine, ActorLossConfig, MicroBatchConfig, OptimConfig, TrainEngineConfig
from train_harness import make_rl_batch

N = 12
ATOL = 1e-5


def _engine(path: str, *, mini: int = N, epochs: int = 1, entropy_coeff: float = 0.0) -> ActorEngine:
    torch.manual_seed(0)
    config = TrainEngineConfig(
        model_path=path, dtype="fp32", seed=0,
        optim=OptimConfig(lr=1e-2, eps=1e-3, weight_decay=0.0, grad_clip=1.0),  # eps: the module docstring
        micro_batch=MicroBatchConfig(mini_batch_size=mini, micro_batch_size_per_device=3,
                                     forward_micro_batch_size_per_device=5, epochs=epochs),
    )
    loss = ActorLossConfig(policy=PolicyLossConfig(loss_mode="vanilla"), entropy_coeff=entropy_coeff)
    return ActorEngine(config, loss)


def _params(engine: ActorEngine) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in engine.named_sharded_parameters()}


def _batch() -> dict[str, torch.Tensor]:
    batch = make_rl_batch(N, seed=3)
    del batch["old_log_probs"]
    return batch


@pytest.mark.usefixtures("single_process_group")
@pytest.mark.parametrize("entropy_coeff", [0.0, 0.01])
def test_fused_update_equals_the_separate_old_log_prob_pass(tiny_llama_dir, entropy_coeff):
    separate = _engine(str(tiny_llama_dir), entropy_coeff=entropy_coeff)
    batch = _batch()
    old, entropy = separate.compute_log_prob(batch, with_entropy=True)
    want = separate.update_policy({**batch, "old_log_probs": old})

    fused = _engine(str(tiny_llama_dir), entropy_coeff=entropy_coeff)
    got = fused.update_policy(batch, fused_old_log_probs=True)

    for key in ("actor/pg_loss", "actor/loss", "actor/grad_norm", "actor/ppo_kl", "actor/pg_clipfrac"):
        assert got[key] == pytest.approx(want[key], abs=ATOL), key
    if entropy_coeff == 0:  # the fused update reports the token-mean entropy the pass would have
        mask = batch["response_mask"].bool()
        assert got["actor/entropy"] == pytest.approx(float(entropy[mask].mean()), abs=ATOL)
    after_separate, after_fused = _params(separate), _params(fused)
    moved = max(float((after_fused[n] - p).abs().max()) for n, p in _params(_engine(str(tiny_llama_dir))).items())
    assert moved > 1e-3  # the step changed the weights, so equal parameters mean something
    for name, p in after_separate.items():
        torch.testing.assert_close(after_fused[name], p, atol=ATOL, rtol=0)


@pytest.mark.usefixtures("single_process_group")
@pytest.mark.parametrize("mini, epochs", [(N, 2), (N // 2, 1)])
def test_fused_update_is_refused_where_it_is_not_exact(tiny_llama_dir, mini, epochs):
    engine = _engine(str(tiny_llama_dir), mini=mini, epochs=epochs)
    with pytest.raises(ValueError, match="fuses the old log-probs"):
        engine.update_policy(_batch(), fused_old_log_probs=True)
    with pytest.raises(KeyError, match="old_log_probs"):  # not fused: the batch must bring them
        engine.update_policy(_batch())
