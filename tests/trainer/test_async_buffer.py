"""The asynchronous trainer's buffer: ordering, staleness accounting, dropped groups."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow.engines.rollout.partial import POLICY_VERSION, oldest_version, split_groups
from hybridflow.protocol import DataProto
from hybridflow.trainer.modes.async_trainer import Group, RolloutBuffer


def _generated(uids: list[str], versions: list[list[int]]) -> DataProto:
    """Samples with 3 response tokens each (the last one padding) and their token versions."""
    n = len(uids)
    mask = torch.tensor([[1, 1, 0]] * n)
    version = torch.tensor([v + [-1] for v in versions])
    return DataProto.from_dict(tensors={"responses": torch.arange(n * 3).view(n, 3), "response_mask": mask,
                                        POLICY_VERSION: version},
                               non_tensors={"uid": np.array(uids, dtype=object)})


def test_split_groups_keeps_order_and_finds_the_oldest_token():
    batch = _generated(["a", "a", "b", "b", "c", "c"], [[3, 3], [2, 3], [3, 3], [3, 3], [1, 2], [2, 2]])
    groups = split_groups(batch)
    assert [g.non_tensor_batch["uid"].tolist() for g in groups] == [["a", "a"], ["b", "b"], ["c", "c"]]
    assert [oldest_version(g) for g in groups] == [2, 3, 1]  # padding (-1) is not a token
    assert torch.equal(groups[1].batch["responses"], batch.batch["responses"][2:4])


def _group(name: str, version: int) -> Group:
    return Group(name, version)


def test_buffer_is_fifo_and_waits_for_a_full_batch():
    buf = RolloutBuffer(capacity=4, max_staleness=1)
    for name in "abc":
        buf.put(_group(name, 0))
    assert buf.take(4, version=0) is None and len(buf) == 3  # not enough yet: nothing taken
    taken = buf.take(2, version=1)
    assert [g.uid for g in taken] == ["a", "b"]
    assert len(buf) == 1 and buf.dropped == 0


def test_staler_groups_are_dropped_and_counted():
    buf = RolloutBuffer(capacity=8, max_staleness=2)
    for name, version in (("old", 0), ("mid", 1), ("new", 3), ("newer", 3)):
        buf.put(_group(name, version))
    # at version 3: "old" lags 3 > 2 (dropped), "mid" lags 2 (kept)
    taken = buf.take(2, version=3)
    assert [g.uid for g in taken] == ["mid", "new"]
    assert buf.dropped == 1
    # dropping happens even when no batch can be taken
    assert buf.take(2, version=6) is None and buf.dropped == 2 and len(buf) == 0


def test_staleness_zero_keeps_only_current_version_and_overflow_is_an_error():
    buf = RolloutBuffer(capacity=2, max_staleness=0)
    buf.put(_group("a", 4))
    buf.put(_group("b", 5))
    with pytest.raises(RuntimeError, match="overflow"):
        buf.put(_group("c", 5))
    assert [g.uid for g in buf.take(1, version=5)] == ["b"] and buf.dropped == 1


@pytest.mark.parametrize("overrides, key", [
    (["trainer.mode=async", "algorithm.name=remax", "reward_model.path=/nonexistent"],
     "trainer.mode: async serves the greedy_baseline capability"),
    (["trainer.mode=one_step_off", "algorithm.name=dapo", "reward_model.path=/nonexistent"],
     "algorithm.dapo.filter_groups.enable: one_step_off serves the dynamic_sampling capability"),
    (["trainer.mode=async", "async_rl.buffer_size=2"], "async_rl.buffer_size"),
    (["trainer.mode=async", "async_rl.rollout_ranks=2", "async_rl.chunk_prompts=3"], "async_rl.chunk_prompts"),
    (["trainer.mode=one_step_off", "async_rl.max_staleness=-1"], "async_rl.max_staleness"),
    # a chunk that admission control can never send beside the groups waiting for a batch: the trainer stalled
    # (data.train_batch_size is 16)
    (["trainer.mode=async", "async_rl.max_staleness=0", "async_rl.chunk_prompts=32"],
     "async_rl.chunk_prompts: 32 prompts per generation call would stall"),
    (["trainer.mode=async", "async_rl.max_staleness=0", "async_rl.chunk_prompts=12"],
     "async_rl.chunk_prompts: 12 prompts per generation call would stall"),
    (["trainer.mode=async", "async_rl.max_staleness=3", "async_rl.chunk_prompts=24", "async_rl.buffer_size=28"],
     "async_rl.chunk_prompts: 24 prompts"),
    # settings the run's mode would not read
    (["trainer.mode=one_step_off", "async_rl.max_staleness=3"], "async_rl.max_staleness: 3 is read only by "
     "trainer.mode=async"),
    (["trainer.mode=one_step_off", "async_rl.steps_per_call=4"], "async_rl.steps_per_call: 4 is read only by "
     "trainer.mode=async"),
    (["trainer.mode=one_step_off", "async_rl.chunk_prompts=2"], "async_rl.chunk_prompts"),
    (["trainer.mode=async", "rollout.name=hf", "async_rl.steps_per_call=4"], "async_rl.steps_per_call: 4 pauses "
     "generation calls for partial rollouts"),
    (["trainer.mode=async", "rollout.agent.enable=true", "async_rl.steps_per_call=4"], "async_rl.steps_per_call"),
])
def test_async_config_errors_name_the_key(overrides, key):
    """(a capability the mode cannot serve is named, never the program)"""
    from hybridflow.config.schema import load_run_config
    from hybridflow.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_run_config(None, ["resources.world_size=1", *overrides])
    assert str(err.value).startswith(key), str(err.value)
    assert "\n" not in str(err.value) and "<function" not in str(err.value)


@pytest.mark.parametrize("overrides", [
    [], ["async_rl.rollout_ranks=1", "async_rl.max_staleness=1"],
    ["async_rl.max_staleness=3", "async_rl.bucket_mb=8"],  # sync reads none: one config, every mode
    ["trainer.mode=one_step_off", "async_rl.max_staleness=1", "async_rl.steps_per_call=null", "async_rl.bucket_mb=8"],
    ["trainer.mode=async", "rollout.name=hf", "async_rl.max_staleness=2", "async_rl.steps_per_call=null"],
    ["trainer.mode=async", "async_rl.max_staleness=0", "async_rl.chunk_prompts=8"],
    ["trainer.mode=async", "async_rl.max_staleness=1", "async_rl.chunk_prompts=32"],
])
def test_async_settings_a_mode_reads_or_that_say_what_it_does_are_accepted(overrides):
    from hybridflow.config.schema import load_run_config

    load_run_config(None, ["resources.world_size=1", *overrides])
