"""engines/train/packed_attention.py: a packed row attended per sequence equals one SDPA
under the block-causal mask transformers builds for it (fp32, 1e-5 abs), with grouped
query heads, a left-padded single row, and the calls it leaves to plain sdpa; a packing
engine loads its model with this kernel. Packed vs padded log-probs of whole models: the
families' tests in test_train_single.py and test_model_families.py."""

from __future__ import annotations

import types

import pytest
import torch

from hybridflow.engines.train import ActorEngine, MicroBatchConfig, TrainEngineConfig
from hybridflow.engines.train.packed_attention import (
    PACKED_SDPA,
    for_packing,
    packed_sdpa_attention,
    sequence_starts,
)

H, KV, D = 4, 2, 8


def _qkv(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, H, n, D, generator=g), torch.randn(1, KV, n, D, generator=g),
            torch.randn(1, KV, n, D, generator=g))


def _block_causal_reference(q, k, v, lengths: list[int]) -> torch.Tensor:
    """One SDPA over the row with the block-causal mask: [1, N, H, D]."""
    seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    causal = torch.ones(len(seq), len(seq)).tril().bool()
    mask = (seq[:, None] == seq[None, :]) & causal
    rep = H // KV
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=mask, scale=D ** -0.5)
    return out.transpose(1, 2)


MODULE = types.SimpleNamespace(num_key_value_groups=H // KV, is_causal=True, training=False)


def test_packed_row_equals_block_causal_sdpa():
    lengths = [5, 1, 9, 3]
    q, k, v = _qkv(sum(lengths))
    position_ids = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    assert sequence_starts(position_ids, q, k) == [0, 5, 6, 15]
    out, weights = packed_sdpa_attention(MODULE, q, k, v, None, position_ids=position_ids, scaling=D ** -0.5)
    assert weights is None
    assert (out - _block_causal_reference(q, k, v, lengths)).abs().max() < 1e-5


def test_left_padded_row_keeps_its_real_tokens():
    # 3 pad tokens at position 0 then a sequence of 6: the pads become sequences of one.
    q, k, v = _qkv(9, seed=1)
    position_ids = torch.tensor([[0, 0, 0, 0, 1, 2, 3, 4, 5]])
    out, _ = packed_sdpa_attention(MODULE, q, k, v, None, position_ids=position_ids, scaling=D ** -0.5)
    expected = _block_causal_reference(q[:, :, 3:], k[:, :, 3:], v[:, :, 3:], [6])
    assert (out[:, 3:] - expected).abs().max() < 1e-5


def test_calls_that_are_not_packed_rows_go_to_plain_sdpa():
    q, k, v = _qkv(6)
    assert sequence_starts(torch.arange(6).unsqueeze(0), q, k) is None  # one sequence
    assert sequence_starts(None, q, k) is None
    assert sequence_starts(torch.tensor([[5]]), q[:, :, -1:], k) is None  # a decode step against a cache
    two_rows = torch.cat([q, q])
    assert sequence_starts(torch.tensor([[0, 1, 2, 0, 1, 2]] * 2), two_rows, torch.cat([k, k])) is None
    # A sliding window shorter than a sequence: the mask transformers built is used as given.
    windowed = types.SimpleNamespace(**vars(MODULE), sliding_window=2)
    position_ids = torch.tensor([[0, 1, 2, 3, 0, 1]])
    mask = torch.zeros(1, 1, 6, 6, dtype=torch.bool)  # unlike any causal pattern: every query sees key 0 only
    mask[..., 0] = True
    out, _ = packed_sdpa_attention(windowed, q, k, v, mask, position_ids=position_ids, scaling=D ** -0.5)
    rep = H // KV
    plain = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=mask, scale=D ** -0.5).transpose(1, 2)
    assert (out - plain).abs().max() < 1e-6
    # An option the per-sequence calls would drop: plain sdpa refuses it, as transformers does.
    with pytest.raises(ValueError, match="softcap"):
        packed_sdpa_attention(MODULE, q, k, v, None, position_ids=position_ids, softcap=30.0)


def test_packing_engine_loads_the_kernel(tiny_llama_dir, single_process_group):
    assert for_packing("eager") == "eager"
    mb = MicroBatchConfig(mini_batch_size=2, micro_batch_size_per_device=2, forward_micro_batch_size_per_device=2)
    packed = ActorEngine(TrainEngineConfig(model_path=str(tiny_llama_dir), dtype="fp32", micro_batch=mb,
                                           pack_sequences=True), trainable=False)
    padded = ActorEngine(TrainEngineConfig(model_path=str(tiny_llama_dir), dtype="fp32", micro_batch=mb),
                         trainable=False)
    assert packed.model.config._attn_implementation == PACKED_SDPA
    assert padded.model.config._attn_implementation == "sdpa"
