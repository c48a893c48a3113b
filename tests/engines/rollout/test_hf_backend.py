"""What only the "hf" backend does: families the native engine lacks, and settings it refuses.

The shared behaviour (layout, stops, log-probs, seeds, release/resume, weight sync) is in
test_backend_contract.py; t_g > 1 through the HybridEngine is in
tests/engines/reshard/test_reshard_dist.py.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from rollout_helpers import build_engine, left_padded

from hybridflow.engines.models import ModelLoadError
from hybridflow.engines.rollout import HFRolloutEngine, RolloutConfig, SamplingParams

CONFIGS = {
    "gpt2": lambda: transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=256, n_positions=64,
                                            bos_token_id=1, eos_token_id=2, pad_token_id=0),
    "phi3": lambda: transformers.Phi3Config(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                            num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                            max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
                                            pad_token_id=0),
}


@pytest.mark.parametrize("family", list(CONFIGS))
def test_families_the_native_engine_lacks(family, tmp_path):
    """Greedy tokens equal transformers' own generate; the native engine refuses the family."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[family](), dtype=torch.float32).eval()
    model.save_pretrained(tmp_path)
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    batch = left_padded([5, 3, 8], vocab=256, seed=1)
    out = build_engine("hf", tmp_path, hf_config=config).generate(
        batch, SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True))
    ref = model.generate(input_ids=batch.batch["input_ids"], attention_mask=batch.batch["attention_mask"],
                         max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(out.batch["responses"], ref[:, batch.batch["input_ids"].shape[1]:])
    with pytest.raises(ModelLoadError, match=family):
        build_engine("native", tmp_path, hf_config=config)


def test_keeping_the_kv_cache_is_refused(tiny_llama_dir):
    with pytest.raises(ValueError, match="keep_kv_cache=False.*rollout.name=native"):
        HFRolloutEngine.from_pretrained(tiny_llama_dir, RolloutConfig(keep_kv_cache=True))
