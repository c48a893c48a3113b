"""Weight sync of the training engine into the hf rollout backend for the families the
native engine lacks (Gemma 2 with soft-capping, Qwen3-MoE with fused 3-D experts,
DeepSeek-V3 with MLA and shared experts), on 2 gloo ranks (FSDP dp 2, t_g = 1).

Weights in the backend equal the gathered training weights exactly (fp32), after an
actor step too; greedy tokens equal transformers' generate with those weights.
"""

from __future__ import annotations

import pytest

import reshard_cases
from reshard_harness import run_ranks


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    from hybridflow.engines.models import save_tiny_model

    root = tmp_path_factory.mktemp("families")
    return [str(save_tiny_model(root / f, f, seed=5)) for f in ("gemma2", "qwen3_moe", "deepseek_v3")]


def test_training_weights_reach_the_hf_backend(family_dirs):
    per_rank = run_ranks(reshard_cases.families_into_hf_backend, 2, family_dirs)
    for results in per_rank:
        assert [r["family"] for r in results] == ["gemma2", "qwen3_moe", "deepseek_v3"]
        for res in results:
            assert res["missing"] == [], res
            assert res["weight_diff"] == 0.0, res
            assert res["tokens_equal"], res
