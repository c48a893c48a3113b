"""Native engine: KV-cache lifetime, sharded loading, continuous-batching work, refused configs.

Release/resume, weight sync and storage accounting are in test_backend_contract.py (all backends).
"""

from __future__ import annotations

import pytest
import torch
from rollout_helpers import left_padded

from hybridflow.engines.models import ModelLoadError, load_hf_config
from hybridflow.engines.precision import resolve_dtype
from hybridflow.engines.rollout import NativeRolloutEngine, RolloutConfig, SamplingParams, shard_for_rank, tp_shard_dim
from hybridflow.engines.rollout.spec import DecoderSpec
from hybridflow.engines.rollout.weights import check_tp_divisibility, iter_safetensors

FP32 = RolloutConfig(dtype=torch.float32)
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True)


def test_kv_cache_freed_by_default_kept_by_option(tiny_llama_dir):
    batch = left_padded([4, 6], vocab=256)
    engine = NativeRolloutEngine.from_pretrained(tiny_llama_dir, FP32)
    engine.generate(batch, GREEDY)
    assert engine.cache is None and engine.last_stats.cache_bytes > 0
    keeper = NativeRolloutEngine.from_pretrained(tiny_llama_dir, RolloutConfig(dtype=torch.float32, keep_kv_cache=True))
    first = keeper.generate(batch, GREEDY)
    kept = keeper.cache
    assert kept is not None
    second = keeper.generate(batch[:1], GREEDY)  # smaller call reuses the same buffers
    assert keeper.cache is kept
    assert torch.equal(second.batch["responses"], first.batch["responses"][:1])
    keeper.generate(batch, SamplingParams(temperature=0.0, max_new_tokens=40, ignore_eos=True))
    assert keeper.cache is not kept and keeper.cache.max_len >= 46  # grew for the longer call


def test_sharded_loading_rules_and_errors(tiny_llama_dir):
    names = dict(iter_safetensors(tiny_llama_dir))
    assert tp_shard_dim("model.layers.0.self_attn.q_proj.weight") == 0
    assert tp_shard_dim("model.layers.3.mlp.down_proj.weight") == 1
    assert tp_shard_dim("model.embed_tokens.weight") == 0
    assert tp_shard_dim("model.layers.0.input_layernorm.weight") is None
    o_proj = "model.layers.0.self_attn.o_proj.weight"
    assert torch.equal(shard_for_rank(names[o_proj], o_proj, 1, 2), names[o_proj][:, 32:])
    engine = NativeRolloutEngine.from_pretrained(tiny_llama_dir, FP32)
    with pytest.raises(ValueError, match="shape"):
        engine.load_weights([("model.layers.0.self_attn.q_proj.weight", torch.zeros(3, 64))], sharded=True)
    with pytest.raises(KeyError, match="unknown parameter"):
        engine.load_weights([("model.layers.9.self_attn.q_proj.weight", torch.zeros(64, 64))])


def test_continuous_batching_decodes_no_padding(tiny_llama_dir):
    """Every decode row-step produces a kept token; n samples share one prefill."""
    lengths, budgets = [3, 10, 5, 7, 2, 8], [2, 17, 5, 11, 1, 9]
    batch = left_padded(lengths, vocab=256, seed=8)
    params = [SamplingParams(temperature=1.0, max_new_tokens=m, n=2, seed=1, ignore_eos=True) for m in budgets]
    engine = NativeRolloutEngine.from_pretrained(tiny_llama_dir, RolloutConfig(dtype=torch.float32, max_num_seqs=4))
    out = engine.generate(batch, params)
    stats = engine.last_stats
    generated = int(out.batch["response_mask"].sum())
    assert generated == 2 * sum(budgets)
    # the first token of each sequence comes from prefill; all other tokens from decode rows
    assert stats.decode_row_steps == generated - stats.requests
    assert stats.max_live <= 4
    roomy = NativeRolloutEngine.from_pretrained(tiny_llama_dir, FP32)
    assert torch.equal(roomy.generate(batch, params).batch["responses"], out.batch["responses"])
    # admitted together, the 2 samples of a prompt share one prefill
    assert roomy.last_stats.prefill_tokens_computed == sum(lengths)


def test_unsupported_configs_are_refused(tiny_llama_dir):
    config = load_hf_config(tiny_llama_dir)
    config.rope_parameters = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    with pytest.raises(ModelLoadError, match="yarn"):
        NativeRolloutEngine(config, FP32)
    config = load_hf_config(tiny_llama_dir)
    config.hidden_act = "gelu"
    with pytest.raises(ModelLoadError, match="gelu"):
        NativeRolloutEngine(config, FP32)
    config = load_hf_config(tiny_llama_dir)
    config.num_key_value_heads = 3
    config.num_attention_heads = 3
    with pytest.raises(ValueError, match="tensor-parallel size 2"):
        check_tp_divisibility(DecoderSpec.from_hf_config(config), 2)


def test_config_dtype_names_resolve_to_torch_dtypes():
    assert RolloutConfig(dtype="bf16").dtype is torch.bfloat16
    assert RolloutConfig(dtype=torch.float32).dtype is torch.float32
    assert RolloutConfig().dtype is resolve_dtype("auto", "cpu")
    with pytest.raises(ValueError, match="dtype"):
        RolloutConfig(dtype="fp16")
