"""Tensor parallelism with tied embeddings and with LoRA adapters vs a single-process reference.

Same measures and tolerances as test_train_parallel.py (fp32): log-probs 1e-5 abs,
gradients 1e-5 x the largest entry, losses 1e-5, parameter update relative error 1e-3.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

import train_cases
from test_train_parallel import _assert_actor_close
from train_harness import run_ranks


@pytest.fixture(scope="module")
def tied_llama_dir(tmp_path_factory):
    """A tiny Llama whose lm_head is the input embedding (as SmolLM2's)."""
    from hybridflow.engines.models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tied") / "llama_tied", "llama", seed=0,
                           tie_word_embeddings=True)


def test_tied_embeddings_tp2_matches_single_process(tied_llama_dir):
    # dp 1 x tp 2: the shared [vocab, hidden] weight is one vocab-sharded DTensor used by
    # both the embedding and lm_head; its gradient sums both uses.
    results = run_ranks(train_cases.actor_matches_reference, 2, str(tied_llama_dir), 2, 2)
    _assert_actor_close(results)


def test_lora_dp2_tp2_matches_single_process(tiny_model_dirs):
    # Qwen2 (q/k/v biases) with adapters on all seven projections, world 4 = dp 2 x tp 2;
    # three steps so the A matrices (zero gradient while B = 0) move too.
    results = run_ranks(train_cases.actor_matches_reference, 4, str(tiny_model_dirs["qwen2"]), 2, 3,
                        False, 4)
    _assert_actor_close(results)
    for res in results:  # the merged weights generation receives (workers/generation_weights.py)
        assert res["merged"] < 1e-5, res["merged"]


@pytest.mark.usefixtures("single_process_group")
def test_lora_on_lm_head_under_tp_is_refused(tied_llama_dir):
    from hybridflow.engines.models import load_model
    from hybridflow.engines.train import LoraConfig
    from hybridflow.engines.train.lora import apply_lora
    from hybridflow.engines.train.parallelize import apply_tensor_parallel

    model = apply_lora(load_model(tied_llama_dir), LoraConfig(rank=2, target_modules=("q_proj", "lm_head")))
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    with pytest.raises(ValueError, match="LoRA on lm_head with tensor parallelism is not supported"):
        apply_tensor_parallel(model, mesh)
    assert isinstance(model.base_model.model.lm_head.weight, torch.nn.Parameter)


def test_tied_tp2_checkpoint_loads_at_dp2_and_exports_tied(tied_llama_dir, tmp_path):
    results = run_ranks(train_cases.tied_tp_checkpoint_across_layouts, 2, str(tied_llama_dir),
                        str(tmp_path / "ckpt"), str(tmp_path / "export"))
    for res in results:
        assert "lm_head.weight" not in res["names"]  # one shared parameter, reported once
        assert res["load_diff"] == 0.0
        assert res["moved"] > 1e-4
        # same step from the same state on another layout (sums in another order)
        assert res["step_diff"] < 1e-5, res["step_diff"]
    assert results[0]["export_tied"]
    assert results[0]["export_log_prob"] < 1e-5
