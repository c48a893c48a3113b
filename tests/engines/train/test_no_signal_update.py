"""A mini-batch without learning signal (every advantage 0) does not move the actor: its
optimizer step is skipped, so parameters and the AdamW state (moments and step count) stay
bit for bit (actor.loss.skip_no_signal_updates, the default); with the setting off the
optimizer steps as before, its momentum moving the weights exactly as a plain
torch.optim.AdamW step on zero gradients does. Across dp ranks the decision is one: a
rank whose shard is silent still steps when another rank's shard has signal."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from hybridflow.algorithms import PolicyLossConfig
from hybridflow.engines.train import ActorEngine, ActorLossConfig, MicroBatchConfig, OptimConfig, TrainEngineConfig
from train_harness import make_rl_batch, run_ranks, shard_rows

N = 8


def _engine(path: str, skip: bool = True, weight_decay: float = 0.1, mini: int = N) -> ActorEngine:
    config = TrainEngineConfig(
        model_path=path, dtype="fp32", seed=0, optim=OptimConfig(lr=1e-2, weight_decay=weight_decay, grad_clip=1.0),
        micro_batch=MicroBatchConfig(mini_batch_size=mini, micro_batch_size_per_device=4,
                                     forward_micro_batch_size_per_device=4),
    )
    return ActorEngine(config, ActorLossConfig(policy=PolicyLossConfig(loss_mode="vanilla"),
                                               skip_no_signal_updates=skip))


def _params(engine: ActorEngine) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in engine.named_sharded_parameters()}


def _silent(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # Zero on every response token; a value on padding (mask 0) is no signal either.
    return {**batch, "advantages": batch["advantages"] * (1 - batch["response_mask"])}


def _trained_once(path: str, skip: bool) -> ActorEngine:
    """An engine after one step with signal: its AdamW moments are non-zero."""
    engine = _engine(path, skip)
    engine.update_policy(make_rl_batch(N, seed=1))
    assert all(s["exp_avg"].abs().sum() > 0 for s in engine.optimizer.state.values())
    return engine


@pytest.mark.usefixtures("single_process_group")
def test_a_silent_mini_batch_leaves_parameters_and_optimizer_state_bit_for_bit(tiny_llama_dir):
    engine = _trained_once(str(tiny_llama_dir), skip=True)
    params, state = _params(engine), copy.deepcopy(engine.optimizer.state_dict())
    metrics = engine.update_policy(_silent(make_rl_batch(N, seed=2)))
    assert metrics["actor/skipped_no_signal"] == 1.0
    assert "actor/grad_norm" not in metrics  # no pass ran: nothing to report but the skip
    for name, p in _params(engine).items():
        assert torch.equal(p, params[name]), name
    after = engine.optimizer.state_dict()
    for key, s in state["state"].items():
        for name, value in s.items():
            assert torch.equal(after["state"][key][name], value), (key, name)  # exp_avg, exp_avg_sq, step
    assert engine.global_step == 2  # the trainer step still counts (the lr schedule follows it)
    signal = engine.update_policy(make_rl_batch(N, seed=3))  # a batch with signal steps again
    assert signal["actor/skipped_no_signal"] == 0.0 and signal["actor/grad_norm"] > 0


@pytest.mark.usefixtures("single_process_group")
def test_a_first_update_without_signal_steps_only_the_schedule(tiny_llama_dir):
    engine = _engine(str(tiny_llama_dir))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "lr_scheduler.step() before optimizer.step()" is not for users
        assert engine.update_policy(_silent(make_rl_batch(N, seed=2)))["actor/skipped_no_signal"] == 1.0
    assert engine.optimizer.state == {} and engine.lr_scheduler.last_epoch == 1


@pytest.mark.usefixtures("single_process_group")
def test_with_the_setting_off_the_optimizer_steps_as_before(tiny_llama_dir):
    engine = _trained_once(str(tiny_llama_dir), skip=False)
    params = _params(engine)
    # What one plain AdamW step on zero gradients does from this state: the reference.
    groups = engine.optimizer.param_groups
    plain = {id(p): torch.nn.Parameter(p.detach().clone()) for g in groups for p in g["params"]}
    reference = torch.optim.AdamW([{"params": [plain[id(p)] for p in g["params"]]} for g in groups], lr=1e-2)
    # Moments, step counts, lr and decay per group; copied: load_state_dict would share the tensors.
    reference.load_state_dict(copy.deepcopy(engine.optimizer.state_dict()))
    for p in plain.values():
        p.grad = torch.zeros_like(p)
    reference.step()

    metrics = engine.update_policy(_silent(make_rl_batch(N, seed=2)))
    assert "actor/skipped_no_signal" not in metrics and metrics["actor/grad_norm"] == 0.0
    moved = max(float((p - params[name]).abs().max()) for name, p in _params(engine).items())
    assert moved > 1e-4  # momentum and weight decay moved the weights on a batch with no signal
    for p in engine.model.parameters():
        torch.testing.assert_close(p.detach(), plain[id(p)].detach(), atol=1e-7, rtol=0)
    assert all(int(s["step"]) == 2 for s in engine.optimizer.state.values())


def _two_rank_updates(rank: int, world: int, path: str) -> list[tuple[float, float]]:
    """(skipped share, largest parameter change) of two updates: rank 1's shard silent, then both."""
    engine = _engine(path, skip=True, mini=2 * N)
    out = []
    for seed, silent_ranks in ((4, (1,)), (5, (0, 1))):
        shard = shard_rows(make_rl_batch(2 * N, seed=seed), world, rank)
        before = _params(engine)
        metrics = engine.update_policy(_silent(shard) if rank in silent_ranks else shard)
        out.append((metrics["actor/skipped_no_signal"],
                    max(float((p.to_local() - before[n].to_local()).abs().max()) for n, p in _params(engine).items())))
    return out


@pytest.mark.slow
def test_ranks_decide_together(tiny_llama_dir):
    # One rank's shard silent, the other's not: both step. Both silent: both skip.
    ranks = run_ranks(_two_rank_updates, 2, str(tiny_llama_dir))
    for rank in ranks:
        (skipped0, moved0), (skipped1, moved1) = rank
        assert (skipped0, skipped1) == (0.0, 1.0)
        assert moved0 > 0 and moved1 == 0.0
