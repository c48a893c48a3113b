"""Generation of every supported family on the Hugging Face backend, and on the native
engine where it has the family (docs/models.md support matrix).

The hf backend (`rollout.name=hf`): greedy tokens equal transformers' own generate of the
same checkpoint, and `rollout_log_probs` equal a full forward pass within 1e-4 (fp32;
KV-cache decoding sums in another order). The native engine generates the same tokens for
its dense families and refuses the others (Gemma 2/3, Qwen3-MoE, DeepSeek-V3) with an
error that names the hf backend. Models are the tiny
configs of engines/models.py with every norm and bias perturbed (rollout_helpers.save_model).
"""

from __future__ import annotations

import pytest
import torch
from rollout_helpers import build_engine, full_forward_log_probs, left_padded, load_hf, save_model

from hybridflow.engines.models import SUPPORTED_FAMILIES, ModelLoadError, load_hf_config
from hybridflow.engines.rollout import HFRolloutEngine, RolloutConfig, SamplingParams
from hybridflow.engines.rollout.spec import NATIVE_FAMILIES

FAMILIES = tuple(SUPPORTED_FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_backend_generates_what_transformers_does(family, tmp_path):
    path = save_model(tmp_path / family, family, seed=21, logit_scale=4.0)
    batch = left_padded([5, 3, 8], vocab=256, seed=2)
    # from_pretrained: MoE experts are stored per expert on disk and fused by transformers' loader
    engine = HFRolloutEngine.from_pretrained(path, RolloutConfig(dtype=torch.float32))
    out = engine.generate(batch, SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True))
    hf = load_hf(path)
    ref = hf.generate(input_ids=batch.batch["input_ids"], attention_mask=batch.batch["attention_mask"],
                      max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(out.batch["responses"], ref[:, batch.batch["input_ids"].shape[1]:])
    # prompts + 8 tokens run past the 4-token sliding window of the Gemma configs
    lp = full_forward_log_probs(hf, out)
    assert (out.batch["rollout_log_probs"] - lp).abs().max() < 1e-4
    if family in NATIVE_FAMILIES:
        native = build_engine("native", path).generate(
            batch, SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True))
        assert torch.equal(native.batch["responses"], out.batch["responses"])
    else:
        with pytest.raises(ModelLoadError, match="rollout.name=hf"):
            build_engine("native", path, hf_config=load_hf_config(path))
