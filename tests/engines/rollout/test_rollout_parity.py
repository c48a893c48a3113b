"""Our decoder against transformers: greedy tokens and per-token log-probs (fp32).

Greedy output must be token-identical to `model.generate` on left-padded prompts of mixed
lengths, for every supported family and for the config features we implement (tied
embeddings, llama3 / linear rope scaling, Mistral's sliding window). Requests get
different max_new_tokens and fewer slots than requests, so continuous batching (slot
reuse, compaction) is exercised; each response must equal the prefix of HF's.
"""

from __future__ import annotations

import pytest
import torch
from rollout_helpers import full_forward_log_probs, left_padded, load_hf, save_model, truncated_log_probs

from hybridflow.engines.rollout import NativeRolloutEngine, RolloutConfig, SamplingParams

LENGTHS = [5, 12, 1, 9, 3]
BUDGETS = [20, 7, 14, 20, 3]

CASES = {
    "llama": ("llama", {}, {}),
    "qwen2": ("qwen2", {}, {}),
    "qwen3": ("qwen3", {}, {}),  # head_dim 128 != hidden / heads
    "mistral_window4": ("mistral", {"sliding_window": 4}, {}),
    "llama_tied": ("llama", {}, {"tie_word_embeddings": True}),
    "llama_biases": ("llama", {"attention_bias": True, "mlp_bias": True}, {}),
    "llama3_rope": (
        "llama",
        {"rope_parameters": {"rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 64}},
        {},
    ),
    "linear_rope": ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}}, {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_matches_transformers_generate(case, tmp_path):
    family, overrides, sizes = CASES[case]
    path = save_model(tmp_path / case, family, seed=1, logit_scale=4.0, config_overrides=overrides, **sizes)
    hf = load_hf(path)
    batch = left_padded(LENGTHS, vocab=256, seed=2)
    ref = hf.generate(
        input_ids=batch.batch["input_ids"], attention_mask=batch.batch["attention_mask"],
        max_new_tokens=max(BUDGETS), do_sample=False, eos_token_id=None, pad_token_id=0,
    )[:, batch.batch["input_ids"].shape[1] :]
    engine = NativeRolloutEngine.from_pretrained(path, RolloutConfig(dtype=torch.float32, max_num_seqs=3))
    params = [SamplingParams(temperature=0.0, max_new_tokens=b, ignore_eos=True) for b in BUDGETS]
    out = engine.generate(batch, params)
    for i, budget in enumerate(BUDGETS):
        assert out.batch["responses"][i, :budget].tolist() == ref[i, :budget].tolist(), f"row {i}"
        assert out.batch["response_mask"][i].sum().item() == budget
    assert list(out.non_tensor_batch["finish_reason"]) == ["length"] * len(BUDGETS)
    assert engine.last_stats.slot_moves > 0  # compaction happened (row 2 finished mid-batch)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
@pytest.mark.parametrize("mode", ["scaled", "processed"])
def test_rollout_log_probs_equal_full_forward(family, mode, tmp_path):
    """Sampled with temperature/top-k/top-p; log-probs recomputed from one HF forward pass."""
    path = save_model(tmp_path / family, family, seed=3, logit_scale=4.0)
    hf = load_hf(path)
    batch = left_padded([4, 11, 7], vocab=256, seed=4)
    temp, top_k, top_p = 0.7, 20, 0.9
    engine = NativeRolloutEngine.from_pretrained(path, RolloutConfig(dtype=torch.float32, log_prob_mode=mode))
    out = engine.generate(batch, SamplingParams(temperature=temp, top_k=top_k, top_p=top_p,
                                                max_new_tokens=12, n=2, seed=5, ignore_eos=True))
    mask = out.batch["response_mask"].bool()
    got = out.batch["rollout_log_probs"]
    expected = full_forward_log_probs(hf, out, temperature=temp)
    if mode == "processed":
        expected = truncated_log_probs(hf, out, temp, top_k, top_p)
    assert torch.allclose(got[mask], expected[mask], atol=1e-4), (got[mask] - expected[mask]).abs().max()
    assert (got[~mask] == 0).all()


@pytest.mark.parametrize("matmul", ["native", "fp32_panels"])
def test_bf16_engine_tracks_fp32_reference(matmul, tmp_path):
    """bf16 decoding runs end to end and its log-probs stay near an fp32 HF forward.

    10 rows: decode products have >= 8 rows, so fp32_panels really takes its panel path."""
    path = save_model(tmp_path / "m", "llama", seed=6, logit_scale=4.0)
    engine = NativeRolloutEngine.from_pretrained(path, RolloutConfig(dtype=torch.bfloat16, matmul=matmul))
    out = engine.generate(left_padded([6, 2, 9, 4, 7, 1, 5, 8, 3, 6], vocab=256, seed=7),
                          SamplingParams(temperature=1.0, max_new_tokens=10, seed=8, ignore_eos=True))
    expected = full_forward_log_probs(load_hf(path), out)
    mask = out.batch["response_mask"].bool()
    err = (out.batch["rollout_log_probs"][mask] - expected[mask]).abs()
    assert err.max() < 0.15 and err.mean() < 0.05, (err.max(), err.mean())
