"""Masked statistics over padded [B, T] tensors: sum, mean, variance, whitening.

Batch-level semantics (used by every estimator that whitens): with `dim=None` the
statistic is taken over *all* unmasked elements of the tensor, each element weighted
equally. For token-level tensors this means every response token counts once, so a long
response contributes more than a short one. Masked positions never influence a result:
they are selected away with `torch.where` (not multiplied by 0), so even NaN or inf
padding cannot leak into a sum or a gradient.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def float_dtype(*tensors: Tensor) -> torch.dtype:
    """The dtype to compute a loss in: the widest input dtype, at least fp32.

    A bf16 log-prob minus an fp32 old log-prob must not be rounded to bf16: exp of the
    difference is the importance ratio, and bf16 keeps only ~3 significant digits.
    """
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def as_bool_mask(mask: Tensor, like: Tensor, name: str = "mask") -> Tensor:
    """`mask` as a bool tensor with the shape of `like` (any nonzero entry counts as kept)."""
    if mask.shape != like.shape:
        raise ValueError(
            f"{name} has shape {tuple(mask.shape)} but the data has shape {tuple(like.shape)}; "
            "they must match exactly"
        )
    return mask if mask.dtype == torch.bool else mask != 0


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum(x[mask]) over `dim` (all elements if None); masked entries contribute exactly 0."""
    m = as_bool_mask(mask, x)
    kept = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_count(mask: Tensor, dim: int | None = None) -> Tensor:
    """Number of kept entries (as int64) over `dim`, or in total if None."""
    m = mask if mask.dtype == torch.bool else mask != 0
    return m.sum() if dim is None else m.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """mean(x[mask]) = sum(mask * x) / sum(mask); 0 where nothing is kept."""
    total = masked_sum(x, mask, dim)
    count = masked_count(as_bool_mask(mask, x), dim).to(total.dtype)
    # clamp only changes the empty case, whose sum is 0, so the result there is 0.
    return total / count.clamp(min=1)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True, dim: int | None = None) -> Tensor:
    """Variance of x[mask]: sum(mask (x - mean)^2) / (n - 1 if unbiased else n); 0 if n too small."""
    mean = masked_mean(x, mask, dim)
    if dim is not None:
        mean = mean.unsqueeze(dim)
    sq = masked_sum((x - mean) ** 2, mask, dim)
    n = masked_count(as_bool_mask(mask, x), dim).to(sq.dtype)
    denom = n - 1 if unbiased else n
    # With n <= 1 (unbiased) there is no spread to measure; report 0 instead of inf/NaN.
    return torch.where(denom > 0, sq / denom.clamp(min=1), torch.zeros_like(sq))


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(x - mean) / sqrt(var + eps) over all kept elements (batch level, unbiased var).

    With `shift_mean=False` the mean is added back, i.e. only the scale is normalised.
    Masked positions of the result are 0.
    """
    m = as_bool_mask(mask, x)
    mean = masked_mean(x, m)
    var = masked_var(x, m, unbiased=True)
    white = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        white = white + mean
    return torch.where(m, white, torch.zeros((), dtype=white.dtype, device=white.device))
