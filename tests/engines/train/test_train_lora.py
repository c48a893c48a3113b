"""LoRA actor: only adapters train, the reference is the base model, export merges adapters.

fp32; tolerances 1e-5 abs on log-probs; "unchanged" base weights are compared exactly.
"""

from __future__ import annotations

import pytest
import torch
from hybridflow.engines.train.distributed import full_tensor
import transformers

from hybridflow.engines.models import load_model
from hybridflow.engines.train import ActorEngine, LoraConfig, MicroBatchConfig, OptimConfig, TrainEngineConfig
from hybridflow.engines.train.export import export_hf
from train_harness import make_rl_batch, reference_log_probs

pytestmark = pytest.mark.usefixtures("single_process_group")


def test_lora_trains_only_adapters_reference_is_base_and_export_merges(tiny_llama_dir, tmp_path):
    config = TrainEngineConfig(
        model_path=str(tiny_llama_dir), dtype="fp32",
        lora=LoraConfig(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "down_proj")),
        optim=OptimConfig(lr=1e-2),
        micro_batch=MicroBatchConfig(mini_batch_size=4, micro_batch_size_per_device=2),
    )
    engine = ActorEngine(config)
    names = {n for n, _ in engine.named_sharded_parameters()}
    trainable = {n for n, p in engine.named_sharded_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert "model.layers.0.self_attn.q_proj.weight" in names  # base weights under HF names

    before = {n: full_tensor(p).clone() for n, p in engine.named_sharded_parameters()}
    batch = make_rl_batch(8, seed=11)
    lp0, _ = engine.compute_log_prob(batch)
    batch["old_log_probs"] = lp0 + 0.2
    for _ in range(2):
        engine.update_policy(batch)
    after = {n: full_tensor(p).clone() for n, p in engine.named_sharded_parameters()}
    for name in names:
        if name in trainable:
            if ".lora_B." in name:  # B starts at 0, so any training moves it
                assert (after[name] - before[name]).abs().max() > 1e-4, name
        else:
            assert torch.equal(after[name], before[name]), name

    mask = batch["response_mask"].bool()
    base = load_model(tiny_llama_dir)
    with torch.no_grad():
        base_lp = reference_log_probs(base, batch)
    ref_lp = engine.compute_ref_log_prob(batch)
    actor_lp, _ = engine.compute_log_prob(batch)
    assert (ref_lp - base_lp)[mask].abs().max() < 1e-5
    assert (actor_lp - base_lp)[mask].abs().max() > 1e-3  # the adapters changed the policy

    export_hf(engine, tmp_path / "merged")
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not any("lora" in n for n, _ in merged.named_parameters())
    with torch.no_grad():
        merged_lp = reference_log_probs(merged, batch)
    assert (merged_lp - actor_lp)[mask].abs().max() < 1e-5


def test_ref_log_prob_without_lora_is_an_error(tiny_llama_dir):
    engine = ActorEngine(TrainEngineConfig(model_path=str(tiny_llama_dir), dtype="fp32"), trainable=False)
    with pytest.raises(ValueError, match="needs a LoRA model"):
        engine.compute_ref_log_prob(make_rl_batch(2))
