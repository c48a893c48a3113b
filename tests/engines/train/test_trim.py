"""forward.trim: a padded micro-batch computes without the columns that are padding in
every row, and its outputs equal the untrimmed model's on every valid position (fp32,
1e-5 abs) with zeros where it cut."""

from __future__ import annotations

import pytest
import torch

from hybridflow.engines.models import load_model
from hybridflow.engines.train import ActorEngine, CriticEngine, CriticLossConfig, MicroBatchConfig, TrainEngineConfig
from hybridflow.engines.train.forward import trim
from train_harness import make_rl_batch, reference_log_probs

pytestmark = pytest.mark.usefixtures("single_process_group")


def _short_batch() -> dict[str, torch.Tensor]:
    """Prompts padded to 8 but at most 5 long, responses padded to 6 but at most 3 long."""
    batch = make_rl_batch(5, prompt_len=8, response_len=6, seed=3)
    prompt = torch.zeros(5, 8, dtype=torch.long)
    for i, n in enumerate((5, 2, 4, 1, 3)):
        prompt[i, 8 - n:] = 1
    response = torch.zeros(5, 6, dtype=torch.long)
    for i, n in enumerate((3, 1, 2, 3, 1)):
        response[i, :n] = 1
    mask = torch.cat([prompt, response], dim=1)
    batch["attention_mask"], batch["response_mask"] = mask, response
    batch["input_ids"] = batch["input_ids"].clamp(min=3) * mask
    batch["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
    batch["responses"] = batch["input_ids"][:, 8:]
    return batch


def _config(path) -> TrainEngineConfig:
    mb = MicroBatchConfig(mini_batch_size=5, micro_batch_size_per_device=5, forward_micro_batch_size_per_device=5)
    return TrainEngineConfig(model_path=str(path), dtype="fp32", micro_batch=mb)


def test_trim_cuts_all_padding_columns_at_both_ends():
    short, r = trim(_short_batch(), 6)
    assert r == 3 and short["input_ids"].shape == (5, 5 + 3) and short["responses"].shape == (5, 3)


def test_log_probs_and_values_of_a_trimmed_batch_equal_the_full_model(tiny_llama_dir):
    batch = _short_batch()
    mask = batch["response_mask"].bool()
    lp, _ = ActorEngine(_config(tiny_llama_dir), trainable=False).compute_log_prob(batch)
    with torch.no_grad():
        expected = reference_log_probs(load_model(tiny_llama_dir), batch)
    assert lp.shape == (5, 6) and (lp - expected)[mask].abs().max() < 1e-5
    assert (lp[:, 3:] == 0).all()
    torch.manual_seed(0)  # the engine seeds the value-head init with config.seed = 0
    critic_ref = load_model(tiny_llama_dir, "critic")
    values = CriticEngine(_config(tiny_llama_dir), CriticLossConfig()).compute_values(batch)
    with torch.no_grad():
        full = critic_ref(batch["input_ids"], batch["attention_mask"], batch["position_ids"])[:, -7:-1]
    assert values.shape == (5, 6) and (values - full)[mask].abs().max() < 1e-5
