"""Chunked log-prob and entropy from logits: exactness, gradients, and bounded fp32 memory."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hybridflow.algorithms import entropy_from_logits, logprobs_from_logits


def _naive_logprob(logits, labels, temperature=1.0):
    return torch.log_softmax(logits.float() / temperature, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def _naive_entropy(logits, temperature=1.0):
    logp = torch.log_softmax(logits.float() / temperature, -1)
    return -(logp.exp() * logp).sum(-1)


def _data(b=3, t=5, v=11, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, t, v, generator=g) * 3).to(dtype)
    labels = torch.randint(0, v, (b, t), generator=g)
    return logits, labels


@pytest.mark.parametrize("chunk_size", [1, 4, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_naive_values_and_gradients(chunk_size, temperature):
    logits, labels = _data()
    ours = logits.clone().requires_grad_(True)
    ref = logits.clone().requires_grad_(True)
    lp = logprobs_from_logits(ours, labels, temperature=temperature, chunk_size=chunk_size)
    ent = entropy_from_logits(ours, chunk_size=chunk_size, temperature=temperature)
    lp_ref = _naive_logprob(ref, labels, temperature)
    ent_ref = _naive_entropy(ref, temperature)
    torch.testing.assert_close(lp, lp_ref)
    torch.testing.assert_close(ent, ent_ref)
    w1, w2 = torch.randn_like(lp), torch.randn_like(ent)
    ((lp * w1).sum() + (ent * w2).sum()).backward()
    ((lp_ref * w1).sum() + (ent_ref * w2).sum()).backward()
    torch.testing.assert_close(ours.grad, ref.grad)


def test_gradcheck_float64():
    logits, labels = _data(b=2, t=3, v=5, dtype=torch.float64)
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda z: logprobs_from_logits(z, labels, temperature=0.8, chunk_size=2), (logits,))
    assert torch.autograd.gradcheck(lambda z: entropy_from_logits(z, chunk_size=4, temperature=1.3), (logits,))


def test_bf16_logits_give_fp32_outputs_and_bf16_gradients():
    logits, labels = _data(dtype=torch.bfloat16)
    ours = logits.clone().requires_grad_(True)
    lp = logprobs_from_logits(ours, labels, chunk_size=4)
    ent = entropy_from_logits(ours, chunk_size=4)
    assert lp.dtype == torch.float32 and ent.dtype == torch.float32
    # Same math as upcasting the bf16 values to fp32 first, chunk by chunk.
    torch.testing.assert_close(lp, _naive_logprob(logits, labels))
    torch.testing.assert_close(ent, _naive_entropy(logits))
    (lp.sum() + ent.sum()).backward()
    assert ours.grad.dtype == torch.bfloat16
    ref = logits.float().requires_grad_(True)
    (_naive_logprob(ref, labels).sum() + _naive_entropy(ref).sum()).backward()
    torch.testing.assert_close(ours.grad.float(), ref.grad, rtol=2e-2, atol=2e-2)


class _LargestFp32(TorchDispatchMode):
    """Records the largest fp32 tensor any op produces (a proxy for peak fp32 memory)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                self.largest = max(self.largest, t.numel())
        return out


def test_bf16_logits_are_never_upcast_whole():
    b, t, v, chunk = 4, 16, 64, 8
    logits, labels = _data(b, t, v, dtype=torch.bfloat16)
    logits.requires_grad_(True)
    with _LargestFp32() as probe:
        lp = logprobs_from_logits(logits, labels, chunk_size=chunk)
        ent = entropy_from_logits(logits, chunk_size=chunk)
        (lp.sum() + ent.sum()).backward()
    assert probe.largest <= chunk * v < b * t * v
    with _LargestFp32() as naive:  # the probe does see a whole-batch upcast
        _naive_logprob(logits, labels).sum().backward()
    assert naive.largest >= b * t * v


def test_entropy_ignores_filtered_tokens():
    logits = torch.tensor([[0.0, 0.0, float("-inf"), float("-inf")]], requires_grad=True)
    ent = entropy_from_logits(logits)
    assert ent.item() == pytest.approx(torch.log(torch.tensor(2.0)).item())
    ent.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_bad_inputs_are_clear_errors():
    logits, labels = _data()
    with pytest.raises(ValueError, match="labels"):
        logprobs_from_logits(logits, labels[:, :2])
    with pytest.raises(ValueError, match=r"labels must be in \[0, 11\)"):
        logprobs_from_logits(logits, labels + 11)
    with pytest.raises(ValueError, match="temperature"):
        entropy_from_logits(logits, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        entropy_from_logits(logits, chunk_size=0)
