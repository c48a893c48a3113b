"""Response log-probs and entropy straight from the final hidden states, a chunk of rows at a time.

`head_log_probs(hidden [N, H], weight [V, H], labels [N], ...)` runs the lm_head product
for `chunk` rows at a time, takes that chunk's log-softmax (and entropy) in fp32 and
drops the chunk: the [N, V] logits never exist, in any dtype, nor does their gradient.
Backward recomputes each chunk's logits from the saved hidden states and weight and
multiplies its logit gradient straight into the hidden-state and weight gradients (the
weight's accumulated in fp32 across chunks). Forward values equal lm_head followed by
`algorithms.logprob` (same products, same fp32 formulas).

`with_head_stats(model, labels, ...)` makes a Hugging Face causal LM's forward return
these instead of logits: its lm_head's forward is swapped for this one during the call,
inside the model's own forward (so FSDP has gathered the head weight). `compiled=True`
runs the per-chunk vocabulary math through torch.compile (one fused kernel per pass on GPUs).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.nn import functional as F

Tensor = torch.Tensor


def _chunk_forward(z: Tensor, labels: Tensor, temperature: float, with_entropy: bool):
    """(log-prob of labels, logsumexp, entropy or None) of one chunk's logits `z` [n, V]."""
    z = z.to(torch.promote_types(z.dtype, torch.float32)) / temperature
    lse = torch.logsumexp(z, dim=-1)
    picked = z.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return picked, lse, None
    p = torch.softmax(z, dim=-1)
    # Tokens filtered to -inf have p = 0 and contribute 0 (not 0 * -inf = NaN).
    pz = torch.where(p > 0, p * z, torch.zeros((), dtype=p.dtype, device=p.device))
    return picked, lse, lse - pz.sum(-1)


def _chunk_backward(z: Tensor, labels: Tensor, lse: Tensor, entropy: Tensor | None, g_lp: Tensor,
                    g_ent: Tensor | None, temperature: float) -> Tensor:
    """d loss / d logits of one chunk, in the logits' dtype: (onehot - p) g_lp / T - p (log p + H) g_ent / T."""
    log_p = z.to(lse.dtype) / temperature - lse.unsqueeze(-1)
    p = log_p.exp()
    d = -p * g_lp.unsqueeze(-1)
    d = d.scatter_add(-1, labels.unsqueeze(-1), g_lp.unsqueeze(-1))
    if g_ent is not None:
        zero = torch.zeros((), dtype=p.dtype, device=p.device)
        d = d + torch.where(p > 0, -p * (log_p + entropy.unsqueeze(-1)), zero) * g_ent.unsqueeze(-1)
    return (d / temperature).to(z.dtype)


_KERNELS: dict[bool, tuple[Callable, Callable]] = {False: (_chunk_forward, _chunk_backward)}


def _kernels(compiled: bool) -> tuple[Callable, Callable]:
    if compiled not in _KERNELS:  # compiled once per process, on first use
        _KERNELS[True] = (torch.compile(_chunk_forward, dynamic=True), torch.compile(_chunk_backward, dynamic=True))
    return _KERNELS[compiled]


class _HeadStats(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, labels: Tensor, temperature: float, chunk: int,
                with_entropy: bool, entropy_grad: bool, compiled: bool):
        fwd, _ = _kernels(compiled)
        n = hidden.shape[0]
        dtype = torch.promote_types(hidden.dtype, torch.float32)
        lp, lse = (torch.empty(n, dtype=dtype, device=hidden.device) for _ in range(2))
        ent = torch.empty(n if with_entropy else 0, dtype=dtype, device=hidden.device)
        for s in range(0, n, chunk):
            rows = slice(s, s + chunk)
            lp[rows], lse[rows], e = fwd(F.linear(hidden[rows], weight), labels[rows], temperature, with_entropy)
            if with_entropy:
                ent[rows] = e
        ctx.save_for_backward(hidden, weight, labels, lse, ent)
        ctx.settings = (temperature, chunk, with_entropy and entropy_grad, compiled)
        if not (with_entropy and entropy_grad):
            ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp: Tensor, g_ent: Tensor | None):
        hidden, weight, labels, lse, ent = ctx.saved_tensors
        temperature, chunk, entropy_grad, compiled = ctx.settings
        _, bwd = _kernels(compiled)
        g_lp = torch.zeros_like(lse) if g_lp is None else g_lp.to(lse.dtype)
        g_ent = g_ent.to(lse.dtype) if entropy_grad and g_ent is not None else None
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=lse.dtype, device=weight.device) \
            if ctx.needs_input_grad[1] else None
        for s in range(0, hidden.shape[0], chunk):
            rows = slice(s, s + chunk)
            h = hidden[rows]
            d = bwd(F.linear(h, weight), labels[rows], lse[rows], ent[rows] if g_ent is not None else None,
                    g_lp[rows], None if g_ent is None else g_ent[rows], temperature)
            if grad_hidden is not None:
                grad_hidden[rows] = d @ weight
            if grad_weight is not None:
                grad_weight += d.t() @ h
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None, None


def head_log_probs(hidden: Tensor, weight: Tensor, labels: Tensor, *, temperature: float = 1.0, chunk: int = 1024,
                   with_entropy: bool = False, entropy_grad: bool = True,
                   compiled: bool = False) -> tuple[Tensor, Tensor | None]:
    """log softmax(hidden @ weight.T / T)[labels] over rows of hidden [..., H] (fp32, labels'
    shape), and the entropy of the same distribution if asked (gradient only with entropy_grad)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    lead = labels.shape
    lp, ent = _HeadStats.apply(hidden.reshape(-1, hidden.shape[-1]), weight, labels.reshape(-1).long(),
                               float(temperature), int(chunk), with_entropy, entropy_grad, compiled)
    return lp.reshape(lead), (ent.reshape(lead) if with_entropy else None)


def can_fuse_head(model: nn.Module) -> bool:
    """Whether `model`'s output head is a plain bias-free Linear whose weight is a local
    tensor (not split over tensor-parallel ranks): what `with_head_stats` needs."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return (type(head) is nn.Linear and head.bias is None
            and type(head.weight) in (torch.Tensor, nn.Parameter))


@contextlib.contextmanager
def with_head_stats(model: nn.Module, labels: Tensor, **kw) -> Iterator[dict[str, Tensor]]:
    """Inside this block, `model`'s lm_head returns [..., 2] = (log-prob of `labels`, entropy)
    per kept position instead of logits; the dict it yields holds "log_probs" and
    "entropy" (or None) after the model's forward. `kw`: head_log_probs' settings."""
    head = model.get_output_embeddings()
    result: dict[str, Tensor] = {}

    def forward(hidden: Tensor) -> Tensor:
        lp, ent = head_log_probs(hidden, head.weight, labels, **kw)
        result["log_probs"], result["entropy"] = lp, ent
        # returned as the model's "logits", so the forward's output carries the graph
        result["output"] = torch.stack([lp, ent if ent is not None else torch.zeros_like(lp)], dim=-1)
        return result["output"]

    head.forward = forward  # an instance attribute shadows the class's forward for this call
    try:
        yield result
    finally:
        del head.forward
