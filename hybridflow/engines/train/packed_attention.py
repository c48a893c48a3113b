"""Attention for packed batches: causal SDPA per sequence instead of one masked SDPA over
the whole pack.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

PACKED_SDPA = "hybridflow_packed_sdpa"


def packed_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; [1, H, N, D] packed rows run per sequence."""
    starts = None if _needs_plain_sdpa(query, kwargs) else sequence_starts(kwargs.get("position_ids"), query, key)
    ends = None if starts is None else starts[1:] + [query.shape[2]]
    window = getattr(module, "sliding_window", None) or kwargs.get("sliding_window")
    if ends is None or (window and max(b - a for a, b in zip(starts, ends)) > window):
        # Not a packed row, or a sliding window shorter than a sequence (Gemma 3, Mistral):
        # the mask that transformers built says what plain causal attention would not.
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    options = {k: kwargs[k] for k in ("dropout", "scaling") if k in kwargs}
    outputs = [sdpa_attention_forward(module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None,
                                      is_causal=True, **options)[0] for a, b in zip(starts, ends)]
    return torch.cat(outputs, dim=1), None


# Attention options the per-sequence calls do not carry: with any of them set, plain sdpa
# handles (or refuses) the call as transformers does.
_PLAIN_ONLY = ("softcap", "position_bias", "s_aux", "sinks")


def _needs_plain_sdpa(query: torch.Tensor, kwargs: dict) -> bool:
    """Calls this kernel leaves alone: off the CPU (a GPU would wait on the host for the
    sequence starts of every layer, and runs its own varlen kernels), or with an option
    in _PLAIN_ONLY."""
    return query.device.type != "cpu" or any(kwargs.get(k) is not None for k in _PLAIN_ONLY)


def sequence_starts(position_ids: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor) -> list[int] | None:
    """Where each sequence of a packed row starts (positions back at 0), or None when the
    call is not a packed row: several rows, queries against a longer cache, one sequence.
    A left-padded single row also restarts (its padding sits at position 0): each pad token
    becomes a sequence of one, and the real tokens attend to exactly themselves as before."""
    n = query.shape[2]
    if position_ids is None or query.shape[0] != 1 or key.shape[2] != n or position_ids.shape[-1] != n:
        return None
    starts = (position_ids.reshape(-1) == 0).nonzero().flatten().tolist()
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    return starts if len(starts) > 1 else None


def for_packing(attn_implementation: str) -> str:
    """The kernel a packing engine loads its model with: this one in place of "sdpa"
    (registered with transformers here; registering again replaces it with itself), any
    other kernel unchanged."""
    if attn_implementation != "sdpa":
        return attn_implementation
    AttentionInterface.register(PACKED_SDPA, packed_sdpa_attention)
    AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)
    return PACKED_SDPA
