"""Engine operations in one process (world size 1) against plain Hugging Face models.

fp32 throughout; tolerances: log-probs, entropy, values, scores 1e-5 abs (the same
math, different kernels and summation order); packed vs padded 1e-5 abs.
"""

from __future__ import annotations

import pytest
import torch
from hybridflow.engines.train.distributed import full_tensor
import transformers

from hybridflow.engines.models import load_model
from hybridflow.engines.train import (
    ActorEngine,
    CriticEngine,
    CriticLossConfig,
    MicroBatchConfig,
    OptimConfig,
    RewardModelEngine,
    TrainEngineConfig,
)
from hybridflow.algorithms import entropy_from_logits
from train_harness import make_rl_batch, reference_log_probs

pytestmark = pytest.mark.usefixtures("single_process_group")


def _config(path, **kw) -> TrainEngineConfig:
    mb = kw.pop("micro_batch", MicroBatchConfig(mini_batch_size=4, micro_batch_size_per_device=2,
                                                 forward_micro_batch_size_per_device=3))
    return TrainEngineConfig(model_path=str(path), dtype="fp32", micro_batch=mb, **kw)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
def test_log_prob_and_entropy_match_plain_model_padded_and_packed(tiny_model_dirs, family):
    path = tiny_model_dirs[family]
    batch = make_rl_batch(7, seed=5)
    mask = batch["response_mask"].bool()
    ref = load_model(path)
    with torch.no_grad():
        expected = reference_log_probs(ref, batch)
        r = batch["responses"].shape[1]
        logits = ref(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     position_ids=batch["position_ids"], use_cache=False).logits[:, -r - 1 : -1]
        expected_entropy = entropy_from_logits(logits)
    padded = ActorEngine(_config(path), trainable=False)
    lp, ent = padded.compute_log_prob(batch, with_entropy=True)
    assert (lp - expected)[mask].abs().max() < 1e-5
    assert (ent - expected_entropy)[mask].abs().max() < 1e-5
    packed = ActorEngine(_config(path, pack_sequences=True), trainable=False)
    lp_packed, ent_packed = packed.compute_log_prob(batch, with_entropy=True)
    assert (lp_packed - lp)[mask].abs().max() < 1e-5
    assert (ent_packed - ent)[mask].abs().max() < 1e-5


def test_temperature_scales_logits(tiny_llama_dir):
    batch = make_rl_batch(4, seed=6)
    engine = ActorEngine(_config(tiny_llama_dir), trainable=False)
    lp, _ = engine.compute_log_prob(batch, temperature=0.7)
    with torch.no_grad():
        expected = reference_log_probs(load_model(tiny_llama_dir), batch, temperature=0.7)
    mask = batch["response_mask"].bool()
    assert (lp - expected)[mask].abs().max() < 1e-5


def _micro_batch_update(path, micro_batch: MicroBatchConfig, pack: bool, checkpointing: bool = False) -> dict:
    engine = ActorEngine(_config(path, micro_batch=micro_batch, pack_sequences=pack,
                                 gradient_checkpointing=checkpointing,
                                 optim=OptimConfig(lr=1e-3, grad_clip=1.0)))
    batch = make_rl_batch(8, seed=7)
    lp, _ = engine.compute_log_prob(batch)
    batch["old_log_probs"] = lp + 0.2 * torch.randn(lp.shape, generator=torch.Generator().manual_seed(0))
    metrics = engine.update_policy(batch)
    params = {n: full_tensor(p).detach().clone() for n, p in engine.named_sharded_parameters()}
    return {"params": params, "loss": metrics["actor/loss"], "grad_norm": metrics["actor/grad_norm"]}


def test_update_is_invariant_to_micro_batching_and_packing(tiny_llama_dir):
    """Same mini-batches cut 4x1, 1x4, by a token budget (packed), or with activation
    checkpointing: same loss, gradient norm and weights."""
    base = dict(mini_batch_size=4)
    runs = {
        "micro1": _micro_batch_update(tiny_llama_dir, MicroBatchConfig(**base, micro_batch_size_per_device=1), False),
        "micro4": _micro_batch_update(tiny_llama_dir, MicroBatchConfig(**base, micro_batch_size_per_device=4), False),
        "dynamic_packed": _micro_batch_update(
            tiny_llama_dir, MicroBatchConfig(**base, use_dynamic_bsz=True, max_tokens_per_device=16), True),
        "checkpointed": _micro_batch_update(
            tiny_llama_dir, MicroBatchConfig(**base, micro_batch_size_per_device=2), False, checkpointing=True),
    }
    ref = runs.pop("micro1")
    for name, run in runs.items():
        assert abs(run["loss"] - ref["loss"]) < 1e-5, name
        assert abs(run["grad_norm"] - ref["grad_norm"]) < 1e-4 * ref["grad_norm"], name
        err = sum(float((run["params"][k] - v).square().sum()) for k, v in ref["params"].items()) ** 0.5
        assert err < 1e-5, (name, err)


def test_critic_values_and_update_match_plain_model(tiny_llama_dir):
    torch.manual_seed(0)  # the engine seeds the value-head init with config.seed = 0
    ref = load_model(tiny_llama_dir, "critic")
    batch = make_rl_batch(6, seed=8)
    engine = CriticEngine(_config(tiny_llama_dir, optim=OptimConfig(lr=1e-3, grad_clip=1e9),
                                  micro_batch=MicroBatchConfig(mini_batch_size=6, micro_batch_size_per_device=2)),
                          CriticLossConfig(cliprange_value=0.2))
    r = batch["responses"].shape[1]
    mask = batch["response_mask"].bool()
    expected = ref(batch["input_ids"], batch["attention_mask"], batch["position_ids"])[:, -r - 1 : -1]
    values = engine.compute_values(batch)
    assert (values - expected)[mask].abs().max() < 1e-5
    batch["values"] = values + 0.3 * torch.randn(values.shape, generator=torch.Generator().manual_seed(1))
    # Reference: one AdamW step on the full batch with the same clipped value loss.
    from hybridflow.algorithms import value_loss

    opt = torch.optim.AdamW([{"params": [p for p in ref.parameters() if p.dim() >= 2], "weight_decay": 0.01},
                             {"params": [p for p in ref.parameters() if p.dim() < 2], "weight_decay": 0.0}],
                            lr=1e-3, foreach=False)
    vpreds = ref(batch["input_ids"], batch["attention_mask"], batch["position_ids"])[:, -r - 1 : -1]
    loss, _ = value_loss(vpreds, batch["values"], batch["returns"], batch["response_mask"], cliprange_value=0.2)
    loss.backward()
    opt.step()
    metrics = engine.update_critic(batch)
    assert abs(metrics["critic/vf_loss"] - loss.item()) < 1e-5
    engine_params = {n: full_tensor(p) for n, p in engine.named_sharded_parameters()}
    for name, p in ref.named_parameters():
        assert (engine_params[name] - p).abs().max() < 1e-5, name


def test_reward_scores_match_hf_sequence_classifier(tiny_reward_dir):
    batch = make_rl_batch(5, seed=9)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tiny_reward_dir)
    hf.config.pad_token_id = 0  # make_rl_batch pads with 0 and never uses 0 for tokens
    # HF pools at the last non-pad token: right-aligned batches only, so compare row by row.
    expected = []
    for i in range(5):
        valid = batch["attention_mask"][i].bool()
        ids = batch["input_ids"][i][valid].unsqueeze(0)
        expected.append(hf(input_ids=ids).logits[0, 0])
    expected = torch.stack(expected).detach()
    for pack in (False, True):
        engine = RewardModelEngine(_config(tiny_reward_dir, pack_sequences=pack))
        scores = engine.compute_scores(batch)
        assert scores.shape == (5,)
        assert (scores - expected).abs().max() < 1e-5, pack
