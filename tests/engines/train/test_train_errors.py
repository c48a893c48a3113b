"""Clear errors for bad model paths, inconsistent batch settings and malformed batches."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.distributed as dist

from hybridflow.engines.models import ModelLoadError, load_model, make_tiny_config
from hybridflow.engines.train import (
    ActorEngine,
    MicroBatchConfig,
    OptimConfig,
    TrainEngineConfig,
)
from hybridflow.engines.train.batching import micro_batch_indices_by_tokens, pack
from hybridflow.engines.train.parallelize import check_tp_divisibility
from hybridflow.errors import ConfigError
from train_harness import make_rl_batch


def test_bad_model_paths(tmp_path, tiny_llama_dir):
    with pytest.raises(ModelLoadError, match="not a directory"):
        load_model(tmp_path / "nope")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ModelLoadError, match="not supported"):
        load_model(tmp_path)
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    shutil.copy(tiny_llama_dir / "config.json", weightless / "config.json")
    with pytest.raises(ModelLoadError, match="no weights"):
        load_model(weightless)
    with pytest.raises(ModelLoadError, match="not a reward model"):
        load_model(tiny_llama_dir, "reward")
    with pytest.raises(ValueError, match="model kind"):
        load_model(tiny_llama_dir, "policy")


def _key_of(err: pytest.ExceptionInfo) -> str:
    return err.value.key


def test_inconsistent_batch_settings():
    uneven = TrainEngineConfig(model_path="m", micro_batch=MicroBatchConfig(mini_batch_size=6,
                                                                            micro_batch_size_per_device=2))
    with pytest.raises(ConfigError, match="2 does not divide the 3 sequences of a mini-batch per dp rank") as err:
        uneven.check_parallel(world_size=2, has_gpu=False, trainable=True)
    assert _key_of(err) == "micro_batch.micro_batch_size_per_device"
    # a frozen engine only scores: the update's mini-batch rules do not apply to it
    assert uneven.check_parallel(world_size=2, has_gpu=False, trainable=False) == 2
    with pytest.raises(ConfigError, match="not divisible by the data-parallel size") as err:
        TrainEngineConfig(model_path="m", micro_batch=MicroBatchConfig(
            mini_batch_size=3, micro_batch_size_per_device=1)).check_parallel(2, False, trainable=True)
    assert _key_of(err) == "micro_batch.mini_batch_size"
    # dynamic batch size only needs the mini-batch to split over dp ranks
    TrainEngineConfig(model_path="m", micro_batch=MicroBatchConfig(
        mini_batch_size=6, micro_batch_size_per_device=4, use_dynamic_bsz=True)).check_parallel(2, False, trainable=True)
    with pytest.raises(ConfigError, match="must be an integer >= 1") as err:
        MicroBatchConfig(micro_batch_size_per_device=0)
    assert _key_of(err) == "micro_batch_size_per_device"
    with pytest.raises(ConfigError, match="does not divide the 4 ranks") as err:
        TrainEngineConfig(model_path="m", tp_size=3).check_parallel(world_size=4, has_gpu=False, trainable=True)
    assert _key_of(err) == "tp_size"
    for key in ("param_offload", "optimizer_offload"):
        with pytest.raises(ConfigError, match="CPU-only") as err:
            TrainEngineConfig(model_path="m", **{key: True}).check_parallel(1, has_gpu=False, trainable=False)
        assert _key_of(err) == key


def test_other_config_errors():
    with pytest.raises(ConfigError, match="total_steps"):
        OptimConfig(lr_schedule="cosine")
    with pytest.raises(ConfigError, match="dtype"):
        TrainEngineConfig(model_path="m", dtype="fp16")
    with pytest.raises(ValueError, match="does not divide"):
        check_tp_divisibility(make_tiny_config("llama", num_attention_heads=4, num_key_value_heads=2), 4)


def test_engine_needs_a_process_group(tiny_llama_dir):
    if dist.is_initialized():
        pytest.skip("another test left a process group initialised in this process")
    with pytest.raises(RuntimeError, match="not initialised"):
        ActorEngine(TrainEngineConfig(model_path=str(tiny_llama_dir)))


@pytest.mark.usefixtures("single_process_group")
def test_malformed_batches(tiny_llama_dir):
    config = TrainEngineConfig(model_path=str(tiny_llama_dir), dtype="fp32",
                               micro_batch=MicroBatchConfig(mini_batch_size=4, micro_batch_size_per_device=2))
    engine = ActorEngine(config)
    batch = make_rl_batch(6)
    with pytest.raises(ValueError, match="not a multiple of the per-rank mini-batch size 4"):
        engine.update_policy(batch)
    del batch["advantages"]
    with pytest.raises(KeyError, match="advantages"):
        engine.update_policy(batch)
    with pytest.raises(ValueError, match="exceeds the micro-batch token budget"):
        micro_batch_indices_by_tokens([5, 9, 3], max_tokens=8, group=None)
    b = make_rl_batch(2)
    with pytest.raises(ValueError, match="start at 0"):
        pack(b["input_ids"], b["attention_mask"], b["position_ids"] + 1)


@pytest.mark.usefixtures("single_process_group")
def test_token_budget_partition_is_balanced_and_fits():
    costs = [9, 1, 8, 2, 7, 3, 6, 4, 5, 5]
    parts = micro_batch_indices_by_tokens(costs, max_tokens=12, group=None)
    sums = [sum(costs[i] for i in p) for p in parts]
    assert sorted(i for p in parts for i in p) == list(range(len(costs)))
    assert len(parts) == 5 and max(sums) <= 12  # 50 tokens -> at least 5 parts of <= 12
    assert max(sums) - min(sums) <= 2


def test_dp_balanced_order_equalises_rank_token_counts():
    from hybridflow.engines.train.batching import dp_balanced_order

    lengths = torch.tensor([30, 29, 28, 27, 4, 3, 2, 1])  # naive halves: 114 vs 10 tokens
    mask = (torch.arange(32) < lengths[:, None]).long()
    perm = dp_balanced_order(mask, 2)
    assert sorted(perm.tolist()) == list(range(8))
    naive = [int(c.sum()) for c in mask.chunk(2)]
    balanced = [int(c.sum()) for c in mask[perm].chunk(2)]
    assert max(balanced) - min(balanced) < max(naive) - min(naive)
    assert max(balanced) - min(balanced) <= max(lengths.tolist())
    with pytest.raises(ValueError, match="cannot be split evenly"):
        dp_balanced_order(mask[:7], 2)
