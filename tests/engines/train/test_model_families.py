"""Gemma 2, Gemma 3 (text), Qwen3-MoE and DeepSeek-V3 in the training engine.

Tiny random configs saved in HF format (engines/models.py: a 4-token sliding window,
soft-caps of 2 (attention, Gemma 2) and 5 (final logits), 4 routed experts + 1 shared).
Log-probs and entropies of the engine (padded and packed micro-batches) equal a plain
Hugging Face forward with the eager attention kernel within 1e-5 (fp32); critic values
likewise where transformers has a token classifier for the family. Distributed training
vs a single-process reference: same measures as test_train_parallel.py.
"""

from __future__ import annotations

import pytest
import torch
import transformers

import train_cases
from hybridflow.algorithms import entropy_from_logits
from hybridflow.engines.models import ModelLoadError, load_model, save_tiny_model
from test_train_parallel import _assert_actor_close
from train_harness import make_rl_batch, reference_log_probs, run_ranks

NEW_FAMILIES = ("gemma2", "gemma3_text", "qwen3_moe", "deepseek_v3")


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("families")
    return {f: save_tiny_model(root / f, f, seed=4) for f in NEW_FAMILIES}


def _hf_eager(path) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()


@pytest.mark.usefixtures("single_process_group")
@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_log_probs_entropy_and_values_equal_hf_forward(family_dirs, family):
    from hybridflow.engines.train import ActorEngine, CriticEngine, MicroBatchConfig, TrainEngineConfig

    path = family_dirs[family]
    batch = make_rl_batch(6, seed=7, prompt_len=7, response_len=6)  # longer than the 4-token window
    mask = batch["response_mask"].bool()
    hf = _hf_eager(path)
    r = batch["responses"].shape[1]
    with torch.no_grad():
        expected = reference_log_probs(hf, batch)
        logits = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    position_ids=batch["position_ids"], use_cache=False).logits[:, -r - 1: -1]
    attn = train_cases.attention_for(str(path))
    mb = MicroBatchConfig(mini_batch_size=2, micro_batch_size_per_device=1, forward_micro_batch_size_per_device=4)
    for pack in (False, True):
        config = TrainEngineConfig(model_path=str(path), dtype="fp32", attn_implementation=attn,
                                   pack_sequences=pack, micro_batch=mb)
        lp, ent = ActorEngine(config, trainable=False).compute_log_prob(batch, with_entropy=True)
        assert (lp - expected)[mask].abs().max() < 1e-5, (pack, (lp - expected)[mask].abs().max())
        assert (ent - entropy_from_logits(logits))[mask].abs().max() < 1e-5, pack
    if hasattr(transformers, f"{type(hf).__name__.removesuffix('ForCausalLM')}ForTokenClassification"):
        critic = CriticEngine(TrainEngineConfig(model_path=str(path), dtype="fp32", attn_implementation=attn,
                                                micro_batch=mb))
        values = critic.compute_values(batch)
        with torch.no_grad():
            inner = critic.model.model
            hidden = inner(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           position_ids=batch["position_ids"]).last_hidden_state
            want = critic.model.score(hidden)[..., 0][:, -r - 1: -1]
        assert (values - want)[mask].abs().max() < 1e-5


def test_features_are_exercised(family_dirs):
    """The tiny configs switch on what makes each family different: a sliding window
    shorter than the test sequences, soft-caps that bind, shared and routed experts."""
    batch = make_rl_batch(2, seed=7, prompt_len=7, response_len=6)
    for family in ("gemma2", "gemma3_text"):
        hf = _hf_eager(family_dirs[family])
        assert hf.config.layer_types == ["sliding_attention", "full_attention"] and hf.config.sliding_window == 4
        with torch.no_grad():
            windowed = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            hf.config.sliding_window = 64
            hf.model.config.sliding_window = 64
            full = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        assert (windowed - full)[batch["attention_mask"].bool()].abs().max() > 1e-4, family
        assert full.abs().max() < 5.0  # tanh soft-cap at 5
    ds = load_model(family_dirs["deepseek_v3"])
    assert hasattr(ds.model.layers[1].mlp, "shared_experts") and hasattr(ds.model.layers[1].mlp, "experts")
    assert not hasattr(ds.model.layers[0].mlp, "experts")  # first_k_dense_replace = 1


def test_gemma2_needs_eager_attention_moe_refuses_tp_and_expert_lora(family_dirs):
    with pytest.raises(ModelLoadError, match="set attn_implementation: eager"):
        load_model(family_dirs["gemma2"], attn_implementation="sdpa")
    from torch.distributed.device_mesh import DeviceMesh  # noqa: F401  (TP refusal needs no mesh)
    from hybridflow.engines.train.parallelize import apply_tensor_parallel

    from hybridflow.engines.train import LoraConfig
    from hybridflow.engines.train.lora import apply_lora

    for family in ("qwen3_moe", "deepseek_v3"):
        with pytest.raises(ValueError, match="mixture-of-experts family .* use tp_size=1"):
            apply_tensor_parallel(load_model(family_dirs[family]), None)
        with pytest.raises(ValueError, match=r"LoRA on model\.layers\.\d\.mlp\.experts .* set lora.target_modules"):
            apply_lora(load_model(family_dirs[family]), LoraConfig(rank=2))


def test_training_matches_single_process(family_dirs, tiny_model_dirs):
    # world 2: MoE families at dp 2 (FSDP shards the fused experts); Gemma 2 and 3 at
    # tp 2 (soft-capped logits gathered from column-parallel lm_head; Gemma 3's scaled
    # embedding vocabulary-parallel and its per-head q/k norms); LoRA on Gemma 2 at tp 2, on
    # Gemma 3 at dp 2 and on Qwen3-MoE at dp 2 (attention projections: the fused experts
    # are not nn.Linear);
    # Mistral (a dense family with no other multi-rank test) at tp 2.
    runs = [(str(family_dirs["qwen3_moe"]), 1, 0), (str(family_dirs["deepseek_v3"]), 1, 0),
            (str(family_dirs["gemma2"]), 2, 0), (str(family_dirs["gemma3_text"]), 2, 0),
            (str(family_dirs["gemma2"]), 2, 4), (str(family_dirs["qwen3_moe"]), 1, 4),
            (str(family_dirs["gemma3_text"]), 1, 4),
            (str(tiny_model_dirs["mistral"]), 2, 0)]
    per_rank = run_ranks(train_cases.families_match_reference, 2, runs)
    for i, run in enumerate(runs):
        results = [res[i] for res in per_rank]
        _assert_actor_close(results)
        if run[2]:
            assert all(res["merged"] < 1e-5 for res in results), run
