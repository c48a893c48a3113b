"""FSDP2 and dp x tp training equal a single-process reference (CPU, gloo, worlds 2 and 4).

Tolerances (fp32): log-probs 1e-5 abs; gradients 1e-5 x the largest gradient entry;
per-step losses 1e-5 abs; parameters after each AdamW step at lr 1e-3: relative error
of the update ||theta - theta_ref|| / ||theta_ref - theta_0|| below 1e-3 (a mis-sharded
or mis-reduced gradient gives O(1); see train_harness.param_update_error for why not
a per-entry bound). bf16: log-probs within 0.1 of fp32 (bf16 has 8 bits of mantissa).
"""

from __future__ import annotations

import math


import train_cases
from train_harness import run_ranks


def _assert_actor_close(results: list[dict]) -> None:
    for res in results:
        assert res["log_prob"] < 1e-5, res["log_prob"]
        assert res["grad"] < 1e-5 * res["grad_scale"], (res["grad"], res["grad_scale"])
        for engine_loss, ref_loss in res["loss"]:
            assert abs(engine_loss - ref_loss) < 1e-5, res["loss"]
        for rel, worst, name in res["param"]:
            assert rel < 1e-3, (rel, worst, name)


def test_fsdp_dp2_matches_single_process(tiny_llama_dir):
    results = run_ranks(train_cases.actor_matches_reference, 2, str(tiny_llama_dir), 1, 3)
    _assert_actor_close(results)


def test_fsdp_tp_2x2_matches_single_process_qwen3_dynamic_packed(tiny_model_dirs):
    # Qwen3: per-head q/k norms under TP; world 4 = dp 2 x tp 2; token-budget micro-batches
    # of packed sequences, whose count the ranks must agree on.
    results = run_ranks(train_cases.actor_matches_reference, 4, str(tiny_model_dirs["qwen3"]), 2, 2, True)
    _assert_actor_close(results)


def test_critic_and_reward_model_tp2_match_single_process(tiny_model_dirs, tiny_reward_dir):
    # Qwen2 critic: q/k/v biases under TP, replicated value head; Llama reward model.
    results = run_ranks(train_cases.critic_and_reward_match_reference, 2,
                        str(tiny_model_dirs["qwen2"]), str(tiny_reward_dir), 2)
    for res in results:
        assert res["values"] < 1e-5
        assert abs(res["vf_loss"][0] - res["vf_loss"][1]) < 1e-5
        rel, worst, name = res["param"]
        assert rel < 1e-3, (rel, worst, name)
        assert res["scores"] < 1e-5


def test_bf16_update_smoke_and_unequal_batches_error(tiny_llama_dir):
    results = run_ranks(train_cases.bf16_actor_smoke, 2, str(tiny_llama_dir))
    for res in results:
        assert res["log_prob"] < 0.1, res["log_prob"]
        assert math.isfinite(res["loss"])
        assert res["dtype"] == "torch.float32"  # master weights stay fp32
        assert res["changed"] > 1e-4
        assert res["mfu"] > 0
        assert "ranks disagree on the number of micro-batches" in res["mismatch"]
