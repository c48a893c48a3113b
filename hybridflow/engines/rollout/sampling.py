"""Sampling parameters and the batched sampler with per-row settings."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridflow.engines.rollout.settings import LOG_PROB_MODES, SamplingParams

@dataclass
class RowSettings:
    """Per-row sampling settings as tensors, aligned with the active batch rows."""

    temperature: torch.Tensor  # fp32 [B, 1]; 1.0 on greedy rows
    top_k: torch.Tensor  # int64 [B, 1]; vocab size when off
    top_p: torch.Tensor  # fp32 [B, 1]
    greedy: torch.Tensor  # bool [B]
    truncating: torch.Tensor  # bool [B]: sampled with top-k or top-p
    max_top_k: int  # largest k among truncating rows (vocab size if any row has no top-k)
    any_truncation: bool
    any_untruncated: bool  # some row samples the full distribution (no top-k/top-p, not greedy)
    any_greedy: bool
    all_greedy: bool
    unit_temperature: bool

    @classmethod
    def build(cls, params: list[SamplingParams], vocab: int, device) -> "RowSettings":
        temps, ks, ps, greedy, truncating = row_columns(params, vocab)
        column = dict(device=device)
        return cls(
            temperature=torch.tensor(temps, dtype=torch.float32, **column)[:, None],
            top_k=torch.tensor(ks, dtype=torch.int64, **column)[:, None],
            top_p=torch.tensor(ps, dtype=torch.float32, **column)[:, None],
            greedy=torch.tensor(greedy, dtype=torch.bool, **column),
            truncating=torch.tensor(truncating, dtype=torch.bool, **column),
            **row_flags(params, vocab),
        )


def row_columns(params: list[SamplingParams], vocab: int):
    """Per-row lists (temperature, top_k, top_p, greedy, truncating) as RowSettings stores them."""
    temps = [1.0 if p.greedy else p.temperature for p in params]
    ks = [vocab if (p.top_k <= 0 or p.top_k >= vocab) else p.top_k for p in params]
    greedy = [p.greedy for p in params]
    truncating = [not p.greedy and (k < vocab or p.top_p < 1.0) for p, k in zip(params, ks)]
    return temps, ks, [p.top_p for p in params], greedy, truncating


def row_flags(params: list[SamplingParams], vocab: int) -> dict[str, int | bool]:
    """The host-side fields of RowSettings (which code paths the sampler takes) for `params`."""
    temps, ks, ps, greedy, truncating = row_columns(params, vocab)
    return dict(
        max_top_k=max((k for k, t in zip(ks, truncating) if t), default=vocab),
        any_truncation=any(truncating),
        any_untruncated=any(not g and not t for g, t in zip(greedy, truncating)),
        any_greedy=any(greedy),
        all_greedy=all(greedy),
        unit_temperature=all(t == 1.0 for t in temps),
    )


# Block size of the two-level inverse CDF: one pass over the vocabulary for block masses,
# then a cumulative sum inside a single block, instead of a float64 cumsum over all tokens.
_CDF_BLOCK = 256
# top-p first looks for the nucleus among this many most likely tokens (sorting the whole
# vocabulary costs ~30x more); rows whose nucleus is larger fall back to a full sort.
_NUCLEUS_CANDIDATES = 1024


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row, the index i with cdf[i-1] < (1-u) * total <= cdf[i] of unnormalised `probs`.

    (1 - u) is in (0, 1], so the target is > 0 and never lands on a zero-probability index.
    """
    b, v = probs.shape
    pad = (-v) % _CDF_BLOCK
    if pad:
        probs = torch.nn.functional.pad(probs, (0, pad))
    blocks = probs.view(b, -1, _CDF_BLOCK)
    outer = blocks.sum(-1, dtype=torch.float64).cumsum_(-1)  # [B, blocks]
    target = (1.0 - uniforms.to(torch.float64)).unsqueeze(-1) * outer[:, -1:]
    blk = torch.searchsorted(outer, target).clamp_(max=outer.shape[-1] - 1)  # [B, 1]
    before = torch.where(blk > 0, outer.gather(-1, (blk - 1).clamp(min=0)), torch.zeros_like(target))
    inner = blocks.gather(1, blk.unsqueeze(-1).expand(b, 1, _CDF_BLOCK)).squeeze(1).to(torch.float64).cumsum_(-1)
    pos = torch.searchsorted(inner, target - before)
    # rounding between the two sums may overshoot the block: stay on its last positive entry
    last_positive = (inner < inner[:, -1:]).sum(-1, keepdim=True)
    return (blk * _CDF_BLOCK + torch.minimum(pos, last_positive)).squeeze(-1)


def _truncated_candidates(scaled: torch.Tensor, lse: torch.Tensor, rows: RowSettings, host_sync: bool):
    """Candidate token ids [B, C] (most likely first) and their top-k/top-p renormalised probs."""
    vocab = scaled.shape[-1]
    width = rows.max_top_k if rows.max_top_k < vocab or not host_sync else min(vocab, _NUCLEUS_CANDIDATES)
    while True:
        vals, ids = scaled.topk(width, dim=-1) if width < vocab else scaled.sort(dim=-1, descending=True)
        rank = torch.arange(width, device=scaled.device)
        cut = vals.masked_fill(rank >= rows.top_k, float("-inf"))
        # top-p renormalises over the top-k survivors; rows without top-k use the full softmax
        has_k = rows.top_k < vocab
        norm = torch.where(has_k, torch.logsumexp(cut, dim=-1, keepdim=True), lse)
        probs = (cut - norm).exp()
        cum = probs.cumsum(dim=-1)
        # every row's nucleus must end inside the candidates, else widen to the full vocabulary
        if width == vocab or bool((has_k | ~rows.truncating[:, None] | (cum[:, -1:] >= rows.top_p)).all()):
            break
        width = vocab
    keep = (cum - probs) < rows.top_p
    keep[:, 0] = True
    probs = probs * keep
    return ids, probs / probs.sum(dim=-1, keepdim=True)


def sample_tokens(
    logits: torch.Tensor, rows: RowSettings, uniforms: torch.Tensor | None, log_prob_mode: str,
    *, host_sync: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; returns (token ids int64 [B], log-probs fp32 [B]).

    host_sync=False: no step reads a device value on the host (capturable in a CUDA graph).
    """
    logits = logits.float()
    scaled = logits if rows.unit_temperature else logits / rows.temperature
    lse = torch.logsumexp(scaled, dim=-1, keepdim=True)
    processed_lp = None
    if rows.all_greedy:
        tokens = logits.argmax(dim=-1)
    else:
        if uniforms is None:
            raise ValueError("sampling rows need uniforms from their generators")
        if rows.any_truncation:
            cand_ids, probs = _truncated_candidates(scaled, lse, rows, host_sync)
            pick = _inverse_cdf(probs, uniforms)
            tokens = cand_ids.gather(-1, pick[:, None]).squeeze(-1)
            processed_lp = probs.gather(-1, pick[:, None]).squeeze(-1).log()
            if rows.any_untruncated:
                # Rows without top-k/top-p pick from the vocabulary in id order, as they do in a
                # batch with no truncating row: a row's tokens do not depend on its neighbours.
                plain = _inverse_cdf((scaled - lse).exp(), uniforms)
                tokens = torch.where(rows.truncating, tokens, plain)
        else:
            tokens = _inverse_cdf((scaled - lse).exp_(), uniforms)
        if rows.any_greedy:
            tokens = torch.where(rows.greedy, logits.argmax(dim=-1), tokens)
    lp = scaled.gather(-1, tokens[:, None]).squeeze(-1) - lse.squeeze(-1)
    if log_prob_mode == "processed" and processed_lp is not None:
        lp = torch.where(rows.truncating, processed_lp, lp)
    return tokens, lp
