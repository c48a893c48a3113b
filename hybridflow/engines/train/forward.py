"""Forward passes of one micro-batch: response log-probs/entropy, values, reward scores.

Layout (ARCHITECTURE.md): `input_ids` = left-padded prompt + right-padded response, of
length S = P + R with R = `responses.shape[1]`. The token at position t is predicted by
the logits at t - 1, so the response tokens (positions S-R .. S-1) use the logits at
positions S-R-1 .. S-2. Only those R positions go through the lm_head (never the full
[B, S, V]), and log-softmax / entropy upcast them to fp32 `chunk_size` rows at a time.
Values follow the same shift (the value of the state before each response token).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from hybridflow.algorithms import entropy_from_logits, logprobs_from_logits
from hybridflow.engines.train.batching import PackedBatch, pack, unpack
from hybridflow.engines.train.lora import hf_model_of
from hybridflow.engines.train.vocab_head import with_head_stats

Tensor = torch.Tensor


def response_length(batch: Mapping[str, Tensor]) -> int:
    """R, the padded response length (`responses.shape[1]`), checked against input_ids."""
    r = batch["responses"].shape[1]
    s = batch["input_ids"].shape[1]
    if not 0 < r < s:
        raise ValueError(
            f"responses length {r} must be in (0, {s}) = (0, input_ids length): input_ids holds prompt + response"
        )
    return r


def trim(batch: Mapping[str, Tensor], r: int) -> tuple[Mapping[str, Tensor], int]:
    """The batch without the columns that are padding in every row, at both ends (keeping
    the last prompt column, whose logits predict the first response token, and one
    response column), and its response length R' <= R."""
    valid = batch["attention_mask"].bool().any(dim=0).nonzero().flatten()
    s = batch["input_ids"].shape[1]
    prompt_width = s - r
    first = min(int(valid[0]), prompt_width - 1) if len(valid) else prompt_width - 1
    end = max(int(valid[-1]) + 1, prompt_width + 1) if len(valid) else prompt_width + 1
    if first == 0 and end == s:
        return batch, r
    out = {k: batch[k][:, first:end] for k in ("input_ids", "attention_mask", "position_ids")}
    out["responses"] = batch["responses"][:, : end - prompt_width]
    return out, end - prompt_width


def pad_responses(values: Tensor, r: int) -> Tensor:
    """[B, R'] -> [B, R], zeros after R' (positions that `trim` cut: padding in every row)."""
    return values if values.shape[1] == r else nn.functional.pad(values, (0, r - values.shape[1]))


def _response_slice(full: Tensor, r: int) -> Tensor:
    # Per-position outputs [B, S] -> the R positions that predict / precede response tokens.
    s = full.shape[1]
    return full[:, s - r - 1 : s - 1]


def _packed_prediction_positions(packed: PackedBatch, attention_mask: Tensor, r: int) -> Tensor:
    # Indices into the packed row of the valid tokens whose next token is a response token.
    b, s = packed.shape
    wanted = torch.zeros(b, s, dtype=torch.bool, device=attention_mask.device)
    wanted[:, s - r - 1 : s - 1] = True
    wanted &= attention_mask.bool()
    return wanted.reshape(-1)[packed.indices].nonzero().squeeze(-1)


def causal_lm_log_probs(
    model: nn.Module,
    batch: Mapping[str, Tensor],
    *,
    temperature: float,
    chunk_size: int,
    pack_sequences: bool,
    with_entropy: bool,
    entropy_grad: bool = True,
    fused_head: bool = False,
    compiled_head: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs [B, R] (fp32) of the response tokens, and their entropy if asked.

    Gradients flow when called under grad mode (to the entropy only with `entropy_grad`:
    a metric-only entropy keeps no softmax over the vocabulary for the backward).
    Positions outside response_mask hold finite garbage (masked downstream).
    """
    r = response_length(batch)
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    stats = _VocabStats(model, temperature, chunk_size, with_entropy, entropy_grad, fused_head, compiled_head)
    if pack_sequences:
        packed = pack(input_ids, attention_mask, batch["position_ids"])
        keep = _packed_prediction_positions(packed, attention_mask, r)
        # Label of a kept position: the next packed token. For a sequence's last token
        # that is the next sequence's first token, a masked garbage label.
        n = packed.input_ids.shape[1]
        labels = packed.input_ids[0, (keep + 1).clamp(max=n - 1)]
        log_probs, entropy = stats(labels, input_ids=packed.input_ids, position_ids=packed.position_ids,
                                   use_cache=False, logits_to_keep=keep)
        lp = _response_slice(unpack(log_probs.reshape(-1), packed, keep), r)
        ent = None if entropy is None else _response_slice(unpack(entropy.reshape(-1), packed, keep), r)
        return lp, ent

    short, r_kept = trim(batch, r)
    s = short["input_ids"].shape[1]
    labels = short["input_ids"][:, -r_kept:]
    # the logits path keeps one position too many and drops it (a slice, as it always has);
    # the fused head takes exactly the positions that predict the labels
    keep = torch.arange(s - r_kept - 1, s - 1, device=labels.device) if fused_head else r_kept + 1
    lp, ent = stats(labels, input_ids=short["input_ids"], attention_mask=short["attention_mask"],
                    position_ids=short["position_ids"], use_cache=False, logits_to_keep=keep)
    return pad_responses(lp, r), (pad_responses(ent, r) if ent is not None else None)


class _VocabStats:
    """One forward of a causal LM to the log-probs of `labels` at the kept positions (and
    their entropy): through logits, or fused into the head (vocab_head.py)."""

    def __init__(self, model: nn.Module, temperature: float, chunk_size: int, with_entropy: bool,
                 entropy_grad: bool, fused: bool, compiled: bool) -> None:
        self.model, self.temperature, self.chunk_size = model, temperature, chunk_size
        self.with_entropy, self.entropy_grad, self.fused, self.compiled = (with_entropy, entropy_grad, fused,
                                                                           compiled)

    def __call__(self, labels: Tensor, **inputs) -> tuple[Tensor, Tensor | None]:
        if not self.fused:
            logits = self.model(**inputs).logits
            # packed: one row of kept positions; padded: the extra last position dropped
            logits = logits[0] if labels.dim() == 1 else logits[:, :-1]
            lp = logprobs_from_logits(logits, labels, self.temperature, self.chunk_size)
            ent = _entropy(logits, self.chunk_size, self.temperature, self.entropy_grad) if self.with_entropy \
                else None
            return lp, ent
        with with_head_stats(hf_model_of(self.model), labels, temperature=self.temperature, chunk=self.chunk_size,
                             with_entropy=self.with_entropy, entropy_grad=self.entropy_grad,
                             compiled=self.compiled) as stats:
            out = self.model(**inputs)
        if "output" not in stats or out.logits is not stats["output"]:
            raise RuntimeError(f"{type(hf_model_of(self.model)).__name__} changes its lm_head's output before "
                               "returning it: the fused head cannot serve it; set fused_head: false")
        return stats["log_probs"], stats["entropy"]


def _entropy(logits: Tensor, chunk_size: int, temperature: float, grad: bool) -> Tensor:
    if grad:
        return entropy_from_logits(logits, chunk_size, temperature)
    with torch.no_grad():
        return entropy_from_logits(logits.detach(), chunk_size, temperature)


def token_scores(model: nn.Module, batch: Mapping[str, Tensor], *, pack_sequences: bool) -> Tensor:
    """Per-position scalar outputs [B, S] in fp32 of a TokenScoreModel (0 at padding if packed)."""
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    if pack_sequences:
        packed = pack(input_ids, attention_mask, batch["position_ids"])
        scores = model(input_ids=packed.input_ids, position_ids=packed.position_ids)
        return unpack(scores.float().reshape(-1), packed)
    return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=batch["position_ids"]).float()


def critic_values(model: nn.Module, batch: Mapping[str, Tensor], *, pack_sequences: bool) -> Tensor:
    """Values [B, R] (fp32): the critic's output at the position before each response token."""
    r = response_length(batch)
    if pack_sequences:
        return _response_slice(token_scores(model, batch, pack_sequences=True), r)
    short, r_kept = trim(batch, r)
    return pad_responses(_response_slice(token_scores(model, short, pack_sequences=False), r_kept), r)


def reward_scores(model: nn.Module, batch: Mapping[str, Tensor], *, pack_sequences: bool) -> Tensor:
    """One score per sequence [B] (fp32), read at its last valid token."""
    scores = token_scores(model, batch, pack_sequences=pack_sequences)
    mask = batch["attention_mask"].bool()
    if not mask.any(dim=-1).all():
        raise ValueError("reward scoring got a sequence with no valid token (attention_mask all 0)")
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, torch.full_like(positions, -1)).max(dim=-1).values
    return scores.gather(1, last.unsqueeze(-1)).squeeze(-1)
