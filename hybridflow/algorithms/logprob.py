"""Log-prob of chosen tokens and entropy from logits, chunked for large vocabularies.

log pi(y_t) = z_{y_t}/tau - logsumexp(z/tau);   H_t = logsumexp(z) - sum_v softmax(z)_v z_v.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor

DEFAULT_CHUNK_SIZE = 1024


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # fp64 stays fp64 (gradcheck); everything narrower is computed in fp32.
    return torch.promote_types(dtype, torch.float32)


def _check(logits: Tensor, chunk_size: int, temperature: float) -> None:
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have a non-empty vocabulary (last) dim, got {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


class _ChunkedLogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor, temperature: float, chunk_size: int) -> Tensor:
        n = logits.shape[0]
        out = torch.empty(n, dtype=_compute_dtype(logits.dtype), device=logits.device)
        for s in range(0, n, chunk_size):
            z = logits[s : s + chunk_size].to(out.dtype) / temperature
            picked = z.gather(-1, labels[s : s + chunk_size].unsqueeze(-1)).squeeze(-1)
            out[s : s + chunk_size] = picked - torch.logsumexp(z, dim=-1)
        ctx.save_for_backward(logits, labels)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        logits, labels = ctx.saved_tensors
        tau, chunk = ctx.temperature, ctx.chunk_size
        grad = torch.empty_like(logits)
        for s in range(0, logits.shape[0], chunk):
            g = grad_out[s : s + chunk].to(_compute_dtype(logits.dtype)).unsqueeze(-1)
            p = torch.softmax(logits[s : s + chunk].to(g.dtype) / tau, dim=-1)
            d = -p * g
            d.scatter_add_(-1, labels[s : s + chunk].unsqueeze(-1), g)
            grad[s : s + chunk] = (d / tau).to(grad.dtype)
        return grad, None, None, None


class _ChunkedEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, temperature: float, chunk_size: int) -> Tensor:
        n = logits.shape[0]
        out = torch.empty(n, dtype=_compute_dtype(logits.dtype), device=logits.device)
        for s in range(0, n, chunk_size):
            z = logits[s : s + chunk_size].to(out.dtype) / temperature
            lse = torch.logsumexp(z, dim=-1)
            p = torch.softmax(z, dim=-1)
            # Tokens filtered to -inf have p = 0 and contribute 0 (not 0 * -inf = NaN).
            pz = torch.where(p > 0, p * z, torch.zeros((), dtype=p.dtype, device=p.device))
            out[s : s + chunk_size] = lse - pz.sum(-1)
        ctx.save_for_backward(logits, out)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        logits, entropy = ctx.saved_tensors
        tau, chunk = ctx.temperature, ctx.chunk_size
        grad = torch.empty_like(logits)
        for s in range(0, logits.shape[0], chunk):
            g = grad_out[s : s + chunk].to(entropy.dtype).unsqueeze(-1)
            log_p = torch.log_softmax(logits[s : s + chunk].to(entropy.dtype) / tau, dim=-1)
            h = entropy[s : s + chunk].unsqueeze(-1)
            p = torch.exp(log_p)
            d = torch.where(p > 0, -p * (log_p + h), torch.zeros((), dtype=p.dtype, device=p.device)) * g
            grad[s : s + chunk] = (d / tau).to(grad.dtype)
        return grad, None, None


def logprobs_from_logits(
    logits: Tensor,
    labels: Tensor,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Tensor:
    """log softmax(logits / temperature)[labels], shape labels.shape, computed in chunks.

    logits: [..., V] (any float dtype); labels: [...] int token ids in [0, V).
    """
    _check(logits, chunk_size, temperature)
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels shape {tuple(labels.shape)} must equal logits shape without the vocab dim "
            f"{tuple(logits.shape[:-1])}"
        )
    if labels.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise ValueError(f"labels must be integer token ids, got {labels.dtype}")
    vocab = logits.shape[-1]
    flat_labels = labels.reshape(-1).to(torch.int64)
    # One host sync per call: an out-of-range id on GPU would otherwise surface later as an
    # asynchronous device assert far from its cause.
    if flat_labels.numel() and (int(flat_labels.min()) < 0 or int(flat_labels.max()) >= vocab):
        raise ValueError(f"labels must be in [0, {vocab}); got range [{int(flat_labels.min())}, {int(flat_labels.max())}]")
    out = _ChunkedLogProb.apply(logits.reshape(-1, vocab), flat_labels, float(temperature), int(chunk_size))
    return out.reshape(labels.shape)


def entropy_from_logits(
    logits: Tensor,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    temperature: float = 1.0,
) -> Tensor:
    """Entropy of softmax(logits / temperature) over the last dim, shape logits.shape[:-1]."""
    _check(logits, chunk_size, temperature)
    vocab = logits.shape[-1]
    out = _ChunkedEntropy.apply(logits.reshape(-1, vocab), float(temperature), int(chunk_size))
    return out.reshape(logits.shape[:-1])
