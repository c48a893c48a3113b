"""Pipeline-parallel training (torch.distributed.pipelining, 1F1B) equals a single-process
reference (CPU, gloo), and its checkpoints move between pp and dp layouts.

Tolerances as in test_train_parallel.py (fp32): log-probs 1e-5 abs; each stage's
gradients 1e-5 x the largest gradient entry; losses 1e-5 abs; parameters after each AdamW
step: relative error of the update below 1e-3 (train_harness.param_update_error).
"""

from __future__ import annotations

import pytest

import train_cases
from test_train_parallel import _assert_actor_close
from train_harness import run_ranks


@pytest.fixture(scope="module")
def four_layer_dirs(tmp_path_factory):
    """Tiny Llama and Qwen2 with 4 decoder layers: 2 per stage at pp 2."""
    from hybridflow.engines.models import save_tiny_model

    root = tmp_path_factory.mktemp("pp_models")
    return {fam: save_tiny_model(root / fam, fam, seed=0, num_hidden_layers=4) for fam in ("llama", "qwen2")}


def _assert_pipeline_close(results: list[dict], pp: int) -> None:
    assert sorted({r["stage"] for r in results}) == list(range(pp))
    # Each parameter lives on exactly one stage, under its Hugging Face name.
    by_stage = {r["stage"]: set(r["stage_params"]) for r in results}
    assert "model.embed_tokens.weight" in by_stage[0] and "lm_head.weight" in by_stage[pp - 1]
    assert not by_stage[0] & by_stage[pp - 1]
    for res in results:
        assert res["entropy_shape"] == (8, 5)
        assert res["frozen_log_prob"] < 1e-5, res["frozen_log_prob"]  # the reference engine (trainable=False)
        assert abs(res["pg_loss"][0] - res["pg_loss"][1]) < 1e-5, res["pg_loss"]
    _assert_actor_close(results)  # log-probs, this stage's gradients, losses, all parameters


def test_pp2_matches_single_process_qwen2(four_layer_dirs):
    # 2 stages x 2 layers; 4 micro-batches per mini-batch, 2 mini-batches per step, 2 steps.
    results = run_ranks(train_cases.pipeline_actor_matches_reference, 2, str(four_layer_dirs["qwen2"]), 2, 1, 2)
    _assert_pipeline_close(results, pp=2)


def test_pp2_x_dp2_fsdp_matches_single_process_llama(four_layer_dirs):
    # 4 ranks: each stage sharded by FSDP2 over its 2-rank dp sub-mesh.
    results = run_ranks(train_cases.pipeline_actor_matches_reference, 4, str(four_layer_dirs["llama"]), 2, 1, 1)
    _assert_pipeline_close(results, pp=2)


@pytest.mark.slow
@pytest.mark.extended  # pp with another dimension: test_pp2_x_dp2_fsdp_matches_single_process_llama
def test_pp2_x_tp2_matches_single_process_llama(four_layer_dirs):
    # 4 ranks: tensor parallelism inside each stage (the embedding plan on stage 0 only,
    # lm_head's on stage 1 only).
    results = run_ranks(train_cases.pipeline_actor_matches_reference, 4, str(four_layer_dirs["llama"]), 2, 2, 1)
    _assert_pipeline_close(results, pp=2)


PIPELINE_FAMILIES = ("qwen3", "mistral", "gemma2", "gemma3_text", "qwen3_moe", "deepseek_v3")


@pytest.mark.slow
def test_pp2_matches_single_process_every_other_family(tiny_model_dirs):
    # One decoder layer per stage: Gemma's scaled embedding stays on stage 0 and its final
    # soft-cap on stage 1; Gemma's sliding-window layer types are looked up by layer index
    # (kept by the placeholders); DeepSeek's stage 0 is its dense layer, stage 1 the experts.
    paths = [str(tiny_model_dirs[f]) for f in PIPELINE_FAMILIES]
    per_rank = run_ranks(train_cases.pipeline_families_match_reference, 2, paths)
    for i, family in enumerate(PIPELINE_FAMILIES):
        results = [rank_results[i] for rank_results in per_rank]
        try:
            _assert_pipeline_close(results, pp=2)
        except AssertionError as err:
            raise AssertionError(f"{family}: {err}") from None


def test_critic_pp2_matches_single_process(four_layer_dirs):
    # Values through the pipeline (forward micro-batches of 3 over 8 rows: the last padded),
    # then an update of 2 mini-batches x 2 micro-batches: value loss and all parameters.
    for res in run_ranks(train_cases.pipeline_critic_matches_reference, 2, str(four_layer_dirs["qwen2"]), 2):
        assert res["values"] < 1e-5
        assert abs(res["vf_loss"][0] - res["vf_loss"][1]) < 1e-5, res["vf_loss"]
        rel, worst, name = res["param"]
        assert rel < 1e-3, (rel, worst, name)


def test_pp2_checkpoint_loads_at_dp2_and_back_and_exports(four_layer_dirs, tmp_path):
    results = run_ranks(train_cases.pipeline_checkpoint_across_layouts, 2, str(four_layer_dirs["llama"]),
                        str(tmp_path))
    for res in results:
        assert res["names"] and res["step"] == 1
        assert res["export_names"] and res["export_diff"] == 0.0  # HF export from the pipeline engine
        assert res["load_diff"] == 0.0 and res["back_load_diff"] == 0.0
        assert res["moved"] > 1e-3  # the steps did move the weights
        assert res["lr"][0] == res["lr"][1]  # the schedule's position came across
        # Restored AdamW moments: with fresh ones the step would differ by ~lr (1e-2). The two
        # layouts sum the gradients in different orders (pp: the whole batch on each stage, dp:
        # an all-reduce of two halves), and AdamW divides that fp32 noise by sqrt(v) + eps, so
        # weights whose gradients nearly cancel amplify it (1.28e-6 measured on one machine).
        # 1e-4 leaves that noise 80x room and still sits 100x below a step with fresh moments.
        assert res["step_diff"] < 1e-4 and res["back_step_diff"] < 1e-4, res


def test_stage_layer_ranges():
    from hybridflow.engines.train.pipeline import stage_layer_ranges

    assert stage_layer_ranges(4, 2) == [range(0, 2), range(2, 4)]
    assert stage_layer_ranges(5, 3) == [range(0, 2), range(2, 4), range(4, 5)]
    with pytest.raises(ValueError, match="between 1 and the model's 2 decoder layers"):
        stage_layer_ranges(2, 3)


def test_stage_keeps_hf_names_and_refuses_tied_embeddings(tmp_path):
    import transformers

    from hybridflow.engines.models import load_model, make_tiny_config, save_tiny_model
    from hybridflow.engines.train.pipeline import SkippedLayer, build_stage

    path = save_tiny_model(tmp_path / "m", "llama", num_hidden_layers=4)
    full = {n for n, _ in load_model(path).named_parameters()}
    first, last = build_stage(load_model(path), 0, 2), build_stage(load_model(path), 1, 2)
    names0, names1 = {n for n, _ in first.named_parameters()}, {n for n, _ in last.named_parameters()}
    assert names0 | names1 == full and not names0 & names1
    assert isinstance(first.model.layers[3], SkippedLayer) and isinstance(last.model.layers[0], SkippedLayer)
    tied = transformers.AutoModelForCausalLM.from_config(make_tiny_config("llama", tie_word_embeddings=True))
    with pytest.raises(ValueError, match="tied input/output embeddings is not supported"):
        build_stage(tied, 0, 2)


@pytest.mark.parametrize("field,value,key", [
    ("pack_sequences", True, "pack_sequences"),
    ("micro_batch.use_dynamic_bsz", True, "micro_batch.use_dynamic_bsz"),
])
def test_pipeline_config_errors(field, value, key):
    from hybridflow.engines.train import MicroBatchConfig, TrainEngineConfig
    from hybridflow.errors import ConfigError

    kwargs = {"pp_size": 2}
    if field == "pack_sequences":
        kwargs["pack_sequences"] = value
    else:
        kwargs["micro_batch"] = MicroBatchConfig(use_dynamic_bsz=value)
    with pytest.raises(ConfigError) as err:
        TrainEngineConfig(model_path="m", **kwargs)
    assert err.value.key == key


def test_pp_with_lora_is_a_config_error():
    from hybridflow.engines.train import LoraConfig, TrainEngineConfig
    from hybridflow.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        TrainEngineConfig(model_path="m", pp_size=2, lora=LoraConfig(rank=4))
    assert err.value.key == "pp_size"


def test_pp_size_must_divide_the_world():
    from hybridflow.engines.train import TrainEngineConfig
    from hybridflow.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        TrainEngineConfig(model_path="m", pp_size=2, tp_size=2).check_parallel(6, False, trainable=False)
    assert err.value.key == "pp_size"
    assert TrainEngineConfig(model_path="m", pp_size=2, tp_size=2).check_parallel(8, False, trainable=False) == 2


@pytest.mark.parametrize("overrides, key, message", [
    (["resources.world_size=2", "actor.pp_size=2", "trainer.mode=one_step_off"], "actor.pp_size",
     "holds one pipeline stage"),
    (["resources.world_size=4", "actor.pp_size=2", "rollout.tensor_model_parallel_size=4"],
     "rollout.tensor_model_parallel_size", "generation groups lie inside one stage"),
    (["resources.world_size=2", "reward_model.path=rm", "reward_model.pp_size=2"], "reward_model.pp_size",
     "no pipelined forward"),
    (["actor.pp_size=2", "actor.pack_sequences=true"], "actor.pack_sequences", "one shape"),
    (["actor.pp_size=2", "actor.lora.rank=4"], "actor.pp_size", "adapters are not cut"),
    (["resources.world_size=2", "algorithm.name=ppo", "critic.pp_size=2", "critic.micro_batch.mini_batch_size=8",
      "critic.micro_batch.micro_batch_size_per_device=8"], "critic.micro_batch.micro_batch_size_per_device",
     "fewer than the pp_size=2 pipeline stages"),
])
def test_run_config_pipeline_errors_name_their_key(overrides, key, message):
    """actor.pp_size reaches the run config; what a run cannot do with it is a ConfigError on its key."""
    from hybridflow.config import ConfigError
    from hybridflow.config.schema import load_run_config
    from hybridflow.config.validation import validate_run_config

    with pytest.raises(ConfigError, match=message) as err:
        validate_run_config(load_run_config(None, overrides))
    assert err.value.key == key


@pytest.mark.slow
@pytest.mark.extended  # a pipelined critic: test_critic_pp2_matches_single_process; in a run: the actor's test below
def test_ppo_run_with_a_pipelined_critic_equals_the_dp_critic(ray_local, tmp_path):
    """An RL run (Ray workers, 2 ranks) with critic.pp_size=2 logs the same critic metrics as
    the same run with a dp=2 critic: the worker dispatch, the collect rank and the update
    all go through the pipeline."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[2] / "trainer"))
    from trainer_helpers import rl_records, tiny_run_config

    from hybridflow.trainer import RLTrainer

    records = {}
    for pp in (1, 2):
        # One critic mini-batch per step: the same samples per optimizer step at dp 2 and at
        # dp 1 (dispatch hands each dp rank a contiguous chunk, so smaller mini-batches
        # would group different samples on the two layouts).
        cfg = tiny_run_config(tmp_path / f"pp{pp}", "algorithm.name=ppo", f"critic.pp_size={pp}",
                              "critic.micro_batch.mini_batch_size=8")
        with RLTrainer(cfg) as trainer:
            result = trainer.train(steps=2)
        records[pp] = rl_records(result.run_dir)
    for dp_rec, pp_rec in zip(records[1], records[2]):
        for key in ("critic/vf_loss", "critic/vpred_mean", "critic/grad_norm", "actor/pg_loss"):
            if key in dp_rec:
                assert abs(dp_rec[key] - pp_rec[key]) < 1e-5, (key, dp_rec[key], pp_rec[key])
        assert "critic/vf_loss" in pp_rec


@pytest.mark.slow
def test_grpo_run_with_a_pipelined_actor_equals_the_dp_actor(ray_local, tmp_path):
    """A GRPO run (Ray workers, 2 ranks, 2 steps) with actor.pp_size=2 (and so a pp 2
    reference) against the same run with a dp 2 actor: the 3D-HybridEngine gathers the two
    stages into each rank's generation engine (p_g = 1), so the same responses are sampled;
    old / reference log-probs and the update go through the pipeline. Metrics (losses, KL,
    gradient norm, rewards) agree within 1e-5, and the exported final policy (parameters
    after both steps) within 1e-5."""
    import sys
    from pathlib import Path

    import torch
    from safetensors.torch import load_file

    sys.path.insert(0, str(Path(__file__).parents[2] / "trainer"))
    from trainer_helpers import rl_records, tiny_run_config

    from hybridflow.trainer import RLTrainer

    records, weights, initial = {}, {}, {}
    for pp in (1, 2):
        # One actor mini-batch per step: the same samples per optimizer step at dp 2 and at
        # dp 1 (dispatch hands each dp rank a contiguous chunk). The untrained model scores 0
        # on every sample (zero advantages): the entropy bonus makes the first step move the
        # policy, so the second step's KL to the reference is not zero.
        cfg = tiny_run_config(tmp_path / f"pp{pp}", "algorithm.name=grpo", f"actor.pp_size={pp}",
                              "actor.micro_batch.mini_batch_size=8", "trainer.save_final_model=true",
                              "actor.loss.use_kl_loss=true", "actor.loss.entropy_coeff=0.01")
        with RLTrainer(cfg) as trainer:
            result = trainer.train(steps=2)
        records[pp] = rl_records(result.run_dir)
        weights[pp] = load_file(str(result.run_dir / "final_model" / "model.safetensors"))
        initial = load_file(str(result.run_dir / "model" / "model.safetensors"))  # the same built-in model
    assert len(records[1]) == len(records[2]) == 2
    keys = [k for k in records[1][0] if k.startswith(("actor/", "critic/score", "reward/", "response_length"))
            and not k.endswith(("lr", "tokens_per_s", "mfu"))]
    assert {"actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/ref_kl"} <= set(keys), keys
    for dp_rec, pp_rec in zip(records[1], records[2]):
        for key in keys:
            assert abs(dp_rec[key] - pp_rec[key]) < 1e-5, (key, dp_rec[key], pp_rec[key])
        assert pp_rec["reshard/comm_bytes"] > 0  # each rank received the other stage's weights
    assert records[2][1]["actor/kl_loss"] > 0  # the reference (pp 2 too) differs from the stepped actor
    assert sorted(weights[1]) == sorted(weights[2])
    diff = max(float((weights[2][k] - weights[1][k]).abs().max()) for k in weights[1])
    moved = max(float((weights[2][k] - initial[k]).abs().max()) for k in initial)
    assert diff < 1e-5 and moved > 1e-4, (diff, moved)
