"""The fused head (vocab_head.py) against lm_head + algorithms.logprob: values and gradients.

Tolerances: fp64 1e-10 (the same formulas, summed in other orders); fp32 log-probs and
entropy 1e-5, gradients 1e-5 relative; bf16 inputs (the products in bf16, the softmax in
fp32, as on a GPU): log-probs equal to the unfused path's bit for bit (the same bf16
logits), gradients 2e-2 relative (the weight gradient is summed over chunks in fp32
instead of by one bf16 product). In the engine (fp32): log-probs, entropy, loss, gradient
norm and updated weights of fused and unfused runs within 1e-5 (relative 1e-4 for the norm).
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F
from train_harness import make_rl_batch

from hybridflow.algorithms import entropy_from_logits, logprobs_from_logits
from hybridflow.engines.train import ActorEngine, ActorLossConfig, MicroBatchConfig, OptimConfig, TrainEngineConfig
from hybridflow.engines.train.distributed import full_tensor
from hybridflow.engines.train.vocab_head import head_log_probs
from hybridflow.errors import ConfigError


def _inputs(dtype: torch.dtype, n: int = 37, hidden: int = 24, vocab: int = 300, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hidden, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=g, dtype=torch.float64) * 0.3).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, (n,), generator=g)
    g_lp, g_ent = torch.randn(n, generator=g, dtype=torch.float64), torch.randn(n, generator=g, dtype=torch.float64)
    return h, w, labels, g_lp, g_ent


def _unfused(h, w, labels, temperature, chunk, entropy_grad):
    logits = F.linear(h, w)
    lp = logprobs_from_logits(logits, labels, temperature, chunk)
    ent = entropy_from_logits(logits if entropy_grad else logits.detach(), chunk, temperature)
    return lp, ent


def _values_and_grads(fn, h, w, labels, g_lp, g_ent, **kw):
    h, w = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    lp, ent = fn(h, w, labels, **kw)
    ((lp * g_lp.to(lp.dtype)).sum() + (ent * g_ent.to(ent.dtype)).sum()).backward()
    return lp.detach(), ent.detach(), h.grad, w.grad


def _fused(h, w, labels, temperature, chunk, entropy_grad):
    return head_log_probs(h, w, labels, temperature=temperature, chunk=chunk, with_entropy=True,
                          entropy_grad=entropy_grad)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("entropy_grad", [True, False])
def test_fused_head_equals_logits_then_log_softmax(dtype, tol, entropy_grad):
    h, w, labels, g_lp, g_ent = _inputs(dtype)
    kw = dict(temperature=0.7, chunk=8, entropy_grad=entropy_grad)  # 8 does not divide the 37 rows
    want = _values_and_grads(_unfused, h, w, labels, g_lp, g_ent, **kw)
    got = _values_and_grads(_fused, h, w, labels, g_lp, g_ent, **kw)
    # bf16: the same bf16 logits through the same fp32 math, so equal values
    value_tol = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 0.0}[dtype]
    for name, a, b in zip(("log_probs", "entropy"), got[:2], want[:2]):
        assert a.dtype == b.dtype and float((a - b).abs().max()) <= value_tol, name
    for name, a, b in zip(("hidden grad", "weight grad"), got[2:], want[2:]):
        assert a.dtype == b.dtype and _rel(a, b) < tol, (name, _rel(a, b))


def _config(path, **kw) -> TrainEngineConfig:
    mb = MicroBatchConfig(mini_batch_size=4, micro_batch_size_per_device=2, forward_micro_batch_size_per_device=3)
    return TrainEngineConfig(model_path=str(path), dtype="fp32", micro_batch=mb, logits_chunk_size=7,
                             optim=OptimConfig(lr=1e-3, grad_clip=1.0), **kw)


def _run(path, fused: bool, pack: bool) -> dict:
    engine = ActorEngine(_config(path, fused_head=fused, pack_sequences=pack), ActorLossConfig(entropy_coeff=0.01))
    batch = make_rl_batch(8, seed=7)
    lp, ent = engine.compute_log_prob(batch, temperature=0.8, with_entropy=True)
    batch["old_log_probs"] = lp + 0.2 * torch.randn(lp.shape, generator=torch.Generator().manual_seed(0))
    metrics = engine.update_policy(batch, temperature=0.8)
    params = {n: full_tensor(p).detach().clone() for n, p in engine.named_sharded_parameters()}
    return {"lp": lp, "ent": ent, "mask": batch["response_mask"].bool(), "params": params, **metrics}


@pytest.mark.usefixtures("single_process_group")
def test_engine_with_fused_head_matches_the_logits_path(tiny_llama_dir):
    """Padded and packed micro-batches (packed vs padded is equal in test_train_single.py)."""
    ref = _run(tiny_llama_dir, False, pack=False)
    mask = ref["mask"]
    for pack in (False, True):
        fused = _run(tiny_llama_dir, True, pack)
        assert (fused["lp"] - ref["lp"])[mask].abs().max() < 1e-5
        assert (fused["ent"] - ref["ent"])[mask].abs().max() < 1e-5
        assert abs(fused["actor/loss"] - ref["actor/loss"]) < 1e-5
        assert abs(fused["actor/grad_norm"] - ref["actor/grad_norm"]) < 1e-4 * ref["actor/grad_norm"]
        err = sum(float((fused["params"][k] - v).square().sum()) for k, v in ref["params"].items()) ** 0.5
        assert err < 1e-5, (pack, err)


def test_fused_head_refused_where_the_head_is_split():
    with pytest.raises(ConfigError) as err:
        TrainEngineConfig(model_path="m", fused_head=True, tp_size=2)
    assert err.value.key == "fused_head"
